package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// plugin list with the stack stopped reads the plugins folder; one it
// cannot read (a file, a folder it may not list) is an error that says
// so, where it printed an empty table and exited 0, as for a folder with
// no plugin in it.
func TestPluginListSaysTheFolderIsUnreadable(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "plugins")
	writeTestFile(t, notDir, []byte("not a folder"))
	var out strings.Builder
	err := pluginCmd([]string{"list", "--plugins-dir", notDir, "--socket", filepath.Join(dir, "none.sock")}, &out)
	if err == nil || !strings.Contains(err.Error(), notDir) {
		t.Fatalf("plugin list of a file: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := pluginCmd([]string{"list", "--plugins-dir", filepath.Join(dir, "none"), "--socket", filepath.Join(dir, "none.sock")}, &out); err != nil {
		t.Fatalf("plugin list of a folder not made yet: %v", err)
	}
}
