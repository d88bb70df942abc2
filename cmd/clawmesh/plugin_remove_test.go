package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A memory plugin's journal (<data>/memories/<plugin>.jsonl) outlives its
// removal, so that a reinstall gets its memories back; `remove --purge`
// deletes it with the plugin's config. Before, nothing did: the journal
// of every plugin ever removed stayed on disk.
func TestPluginRemovePurgeDeletesMemoryJournal(t *testing.T) {
	data := t.TempDir()
	plugins := filepath.Join(data, "plugins")
	socket := filepath.Join(t.TempDir(), "none.sock")
	src := t.TempDir()
	writeTestFile(t, filepath.Join(src, "manifest.toml"), []byte(calendarManifest))
	writeTestFile(t, filepath.Join(src, "plugin.wasm"), []byte("module"))
	journal := filepath.Join(data, "memories", "team-calendar.jsonl")
	other := filepath.Join(data, "memories", "kv.jsonl")
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := pluginCmd(append(args[:1:1], append([]string{"--plugins-dir", plugins, "--config-dir", data, "--socket", socket}, args[1:]...)...), &out)
		return out.String(), err
	}
	install := func() {
		t.Helper()
		if out, err := run("install", src+"/"); err != nil {
			t.Fatalf("install: %v\n%s", err, out)
		}
		writeTestFile(t, journal, []byte(`{"op":"store","key":"YQ=="}`+"\n"))
		writeTestFile(t, journal+".123", []byte("a rewrite cut short"))
		writeTestFile(t, other, []byte(`{"op":"store","key":"YQ=="}`+"\n"))
	}

	install()
	if out, err := run("remove", "team-calendar"); err != nil {
		t.Fatalf("remove: %v\n%s", err, out)
	}
	if _, err := os.Stat(journal); err != nil {
		t.Fatalf("remove without --purge: the journal is gone: %v", err)
	}

	install()
	out, err := run("remove", "--purge", "team-calendar")
	// The stack is not running: the config entry stays, and says so.
	if err == nil || !strings.Contains(err.Error(), "config entry was kept") {
		t.Fatalf("remove --purge: %v\n%s", err, out)
	}
	for _, p := range []string{journal, journal + ".123"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("remove --purge left %s: %v\n%s", p, err, out)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another plugin's journal: %v", err)
	}
}
