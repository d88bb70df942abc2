//go:build !linux

package install

import (
	"os"
	"path/filepath"
)

// exchange moves dst aside, then staged into place: a scan between the two
// renames finds its folder moved aside, never half-written (the plugin
// sandbox serves the version it loaded until the new one is in place).
func exchange(staged, dst string) error {
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
