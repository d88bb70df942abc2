//go:build unix

package trust

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ownedSafely reports why fi (of path p) could be changed by someone
// other than the sandbox's user or root: another owner, write access for
// everyone, or for a group other than the sandbox's own (a user's private
// group under umask 002, a Kubernetes volume's fsGroup). A folder
// writable by everyone but sticky (/tmp) lets nobody rename or remove
// what others own in it, so it is safe as an ancestor; inside a plugin it
// is not.
func ownedSafely(p string, fi fs.FileInfo, stickyOK bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, not by this user (uid %d) or root", ErrUntrusted, p, uid, os.Geteuid())
	}
	perm := fi.Mode().Perm()
	if stickyOK && fi.IsDir() && fi.Mode()&fs.ModeSticky != 0 {
		return nil
	}
	if perm&0o002 != 0 || perm&0o020 != 0 && int(st.Gid) != os.Getegid() {
		return fmt.Errorf("%w: %s is writable by others (mode %04o, group %d); `chmod go-w` it", ErrUntrusted, p, perm, st.Gid)
	}
	return nil
}

// CheckPluginsDir checks the plugins folder and every folder above it: a
// plugin runs with the grants its manifest asks for, so whoever can write
// or rename one of them chooses what loads. A symlinked path is checked
// where it leads.
func CheckPluginsDir(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return err
	}
	for p := real; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if err := ownedSafely(p, fi, p != real); err != nil {
			return err
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// CheckPluginFolder checks a plugin's folder and everything in it. Links
// are not followed (the loader refuses them where it reads), so their own
// bits do not matter.
func CheckPluginFolder(dir string) error {
	n := 0
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n > MaxEntries {
			return fmt.Errorf("plugin folder holds more than %d files and folders", MaxEntries)
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return ownedSafely(p, fi, false)
	})
}
