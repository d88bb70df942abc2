//go:build unix

// Package pathcheck refuses paths another local user could change. A
// folder on the way that is theirs, or one they may write that is not
// sticky (as /tmp is), lets them rename what the stack keeps below it and
// put their own in its place; a link on the way that is theirs, point it
// elsewhere. The launcher checks the data directory with it, the plugin
// sandbox the plugins folder.
package pathcheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Above checks every component of the absolute path p above p itself,
// from the root down, without following links: a link must be this
// user's or root's, a folder too, and writable by neither others nor its
// group unless sticky. With ownGroup, a folder writable by the process's
// own group passes (a Kubernetes volume's fsGroup, a user's private
// group), for callers where that group is the stack's alone.
func Above(p string, ownGroup bool) error {
	var parts []string
	for d := filepath.Dir(filepath.Clean(p)); ; d = filepath.Dir(d) {
		parts = append(parts, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	for i := len(parts) - 1; i >= 0; i-- {
		d := parts[i]
		fi, err := os.Lstat(d)
		if err != nil {
			return err
		}
		if err := Owned(d, fi, Rule{OwnGroup: ownGroup, Sticky: true}); err != nil {
			return err
		}
	}
	return nil
}

// Rule says what write access Owned lets pass.
type Rule struct {
	// OwnGroup lets the process's own group write.
	OwnGroup bool
	// Sticky lets anyone write a sticky folder: nobody may rename or
	// remove what others own in it, which is enough above a path, not
	// for a folder whose every entry is read (a plugin's).
	Sticky bool
}

// Owned checks one file, folder or link, fi being its Lstat: this user's
// or root's and, but for a link (whose bits mean nothing), writable by
// neither others nor its group, as far as r allows.
func Owned(p string, fi fs.FileInfo, r Rule) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", p)
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%s belongs to another user (uid %d)", p, uid)
	}
	perm := fi.Mode().Perm()
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
	case r.Sticky && fi.IsDir() && fi.Mode()&fs.ModeSticky != 0:
	case perm&0o002 != 0, perm&0o020 != 0 && !(r.OwnGroup && int(st.Gid) == os.Getegid()):
		return fmt.Errorf("%s is writable by others (mode %04o, group %d); `chmod go-w` it", p, perm, st.Gid)
	}
	return nil
}
