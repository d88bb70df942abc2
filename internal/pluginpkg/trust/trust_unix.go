//go:build unix

package trust

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/clawmesh/clawmesh/internal/pathcheck"
)

// inside is the rule for the plugins folder and what it holds: the
// sandbox's own group may write (a user's private group under umask 002,
// a Kubernetes volume's fsGroup), never another; a sticky folder is safe
// only above the plugins folder, not inside a plugin, whose every entry
// is read.
var inside = pathcheck.Rule{OwnGroup: true}

// CheckPluginsDir checks the plugins folder and every folder above it: a
// plugin runs with the grants its manifest asks for, so whoever can write
// or rename one of them chooses what loads. A symlinked path is checked
// where it leads.
func CheckPluginsDir(dir string) error { return checkPluginsDir(dir, true) }

// CheckPluginsDirItself checks the plugins folder alone, not the folders
// above it: where it is checked from another container than the
// sandbox's (clawmesh doctor in a gateway's pod), those folders are not
// the ones the sandbox sees above it.
func CheckPluginsDirItself(dir string) error { return checkPluginsDir(dir, false) }

func checkPluginsDir(dir string, above bool) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	if real, err = filepath.Abs(real); err != nil {
		return err
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return err
	}
	if err := pathcheck.Owned(real, fi, inside); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	if !above {
		return nil
	}
	if err := pathcheck.Above(real, inside.OwnGroup); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	return nil
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
		if err := pathcheck.Owned(p, fi, inside); err != nil {
			return fmt.Errorf("%w: %w", ErrUntrusted, err)
		}
		return nil
	})
}
