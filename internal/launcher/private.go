package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/clawmesh/clawmesh/internal/pathcheck"
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

// checkChain checks the absolute path dir: every component above it
// (pathcheck.Above, no group write), and dir itself, a link this user's
// or root's, or a folder this user's.
func checkChain(dir string) error {
	uid := uint32(os.Geteuid())
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrDataDirNotPrivate, dir, fmt.Sprintf(format, args...))
	}
	d := filepath.Clean(dir)
	if err := pathcheck.Above(d, false); err != nil {
		return refuse("%v", err)
	}
	fi, err := os.Lstat(d)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if err := pathcheck.Owned(d, fi, pathcheck.Rule{}); err != nil {
			return refuse("the link %v", err)
		}
		return nil
	}
	if !fi.IsDir() {
		return refuse("not a folder")
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != uid {
		return refuse("the folder belongs to another user; it must be this user's (uid %d)", uid)
	}
	return nil
}
