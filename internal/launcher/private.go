package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrDataDirNotPrivate: another user could change what the data directory
// holds.
var ErrDataDirNotPrivate = errors.New("data directory is not private")

// checkPrivate refuses a data directory another user could change: the
// folder must be this user's, and every folder above it, and every link
// on the way, this user's or root's, none writable by group or others
// unless sticky (as /tmp). The path as given and the path its links lead
// to are both checked.
//
// The launcher made the folder 0700 and went on: a folder another user
// made first (a --config-dir in a shared /tmp, or under a folder that
// user owns) stayed theirs, chmod or not. They could then plant links
// where the stack writes (a log named as a link to any file the
// launcher's user may write, root's included, was appended to), and
// replace the secret key, the bus seeds and the database password with
// their own, before or after the launcher wrote them.
func checkPrivate(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if err := checkChain(dir); err != nil {
		return err
	}
	if real != dir {
		return checkChain(real)
	}
	return nil
}

// checkChain checks the components of the absolute path dir, from the
// root down, without following the last.
func checkChain(dir string) error {
	uid := uint32(os.Geteuid())
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrDataDirNotPrivate, dir, fmt.Sprintf(format, args...))
	}
	var parts []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		parts = append(parts, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	for i := len(parts) - 1; i >= 0; i-- {
		d := parts[i]
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return refuse("%s: no owner to check", d)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if st.Uid != uid && st.Uid != 0 {
				return refuse("the link %s belongs to another user (uid %d)", d, st.Uid)
			}
		case i == 0:
			if !fi.IsDir() {
				return refuse("not a folder")
			}
			if st.Uid != uid {
				return refuse("the folder belongs to another user (uid %d); it must be this user's (uid %d)", st.Uid, uid)
			}
		default:
			if st.Uid != uid && st.Uid != 0 {
				return refuse("the folder %s above it belongs to another user (uid %d)", d, st.Uid)
			}
			if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
				return refuse("the folder %s above it is writable by group or others (mode %04o) and not sticky", d, fi.Mode().Perm())
			}
		}
	}
	return nil
}
