//go:build unix

package trust_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/trust"
)

// Every folder above the plugins folder counts: one anybody may write
// lets them rename the plugins folder away and put their own in its
// place, unless it is sticky (/tmp), where nobody moves what is not
// theirs. Group write is refused only for a group other than our own.
func TestPluginsDirAndTheFoldersAboveIt(t *testing.T) {
	top := t.TempDir()
	shared := filepath.Join(top, "shared")
	plugins := filepath.Join(shared, "plugins")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := trust.CheckPluginsDir(plugins); err != nil {
		t.Fatalf("a safe path: %v", err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	err := trust.CheckPluginsDir(plugins)
	if !errors.Is(err, trust.ErrUntrusted) || !strings.Contains(err.Error(), shared+" is writable by others") {
		t.Fatalf("a folder above writable by all: %v", err)
	}
	if err := os.Chmod(shared, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := trust.CheckPluginsDir(plugins); err != nil {
		t.Fatalf("a sticky folder above: %v", err)
	}
	// Reached through a link: checked where it leads.
	link := filepath.Join(top, "link")
	if err := os.Symlink(plugins, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(plugins, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := trust.CheckPluginsDir(link); !errors.Is(err, trust.ErrUntrusted) {
		t.Fatalf("the plugins folder itself sticky and writable by all, through a link: %v", err)
	}
	if err := os.Chmod(plugins, 0o775); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(plugins, -1, os.Getegid()); err != nil {
		t.Fatal(err)
	}
	if err := trust.CheckPluginsDir(plugins); err != nil {
		t.Fatalf("writable by our own group: %v", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(plugins, -1, 4242); err != nil {
			t.Fatal(err)
		}
		if err := trust.CheckPluginsDir(plugins); !errors.Is(err, trust.ErrUntrusted) || !strings.Contains(err.Error(), "group 4242") {
			t.Fatalf("writable by another group: %v", err)
		}
	}
}

// A plugin folder with more entries than the check reads is refused.
func TestPluginFolderEntriesBounded(t *testing.T) {
	dir := t.TempDir()
	for i := range trust.MaxEntries {
		if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := trust.CheckPluginFolder(dir); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("a folder of %d files and itself: %v", trust.MaxEntries, err)
	}
}
