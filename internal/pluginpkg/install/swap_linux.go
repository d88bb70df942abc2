//go:build linux

package install

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// exchange puts the staged folder staged at dst, which holds the installed
// version: both names are swapped in one atomic renameat2 (no instant
// without a plugin at dst), and the old version, now at staged, is
// removed. Filesystems without RENAME_EXCHANGE get two renames.
func exchange(staged, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, staged, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return swapByRenames(staged, dst)
	}
	if err != nil {
		return &os.LinkError{Op: "renameat2", Old: staged, New: dst, Err: err}
	}
	return os.RemoveAll(staged)
}

// swapByRenames moves dst aside, then staged into place: a scan between
// the two finds its folder moved aside, never half-written (the plugin
// sandbox serves the version it loaded until the new one is in place).
func swapByRenames(staged, dst string) error {
	old := filepath.Join(filepath.Dir(dst), ReplacedPrefix+randomSuffix())
	if err := os.Rename(dst, old); err != nil {
		return err
	}
	if err := os.Rename(staged, dst); err != nil {
		_ = os.Rename(old, dst)
		return err
	}
	return os.RemoveAll(old)
}
