package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// With the stack running on another data directory than the CLI's own
// (--socket, or ZEROCLAW_SOCKET, names its socket), remove and --purge
// act on the stack's: its plugins folder (plugins.plugins_dir empty)
// and its memory journal, taken from status's config_dir. Before, both
// were the CLI's: the plugin was "not installed", and a --purge that
// found it deleted a journal the stack never reads while the stack's
// stayed.
func TestPluginRemovePurgeActsOnTheStacksDataDir(t *testing.T) {
	stackData, cliData := t.TempDir(), t.TempDir()
	writeTestFile(t, filepath.Join(stackData, "plugins", "team-calendar", "manifest.toml"), []byte(calendarManifest))
	writeTestFile(t, filepath.Join(stackData, "plugins", "team-calendar", "plugin.wasm"), []byte("module"))
	stackJournal := filepath.Join(stackData, "memories", "team-calendar.jsonl")
	cliJournal := filepath.Join(cliData, "memories", "team-calendar.jsonl")
	writeTestFile(t, stackJournal, []byte(`{"op":"store","key":"YQ=="}`+"\n"))
	writeTestFile(t, cliJournal, []byte(`{"op":"store","key":"YQ=="}`+"\n"))
	var deleted []string
	var mu sync.Mutex
	sock := fakeSocket(t, func(conn net.Conn) {
		defer conn.Close()
		lines := bufio.NewScanner(conn)
		for lines.Scan() {
			var req struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Params struct {
					Prop string `json:"prop"`
				} `json:"params"`
			}
			if json.Unmarshal(lines.Bytes(), &req) != nil {
				return
			}
			var result any
			switch {
			case req.Method == "initialize":
				result = map[string]any{"protocol_version": 1}
			case req.Method == "status":
				result = map[string]any{"config_dir": stackData, "active_sessions": 0}
			case req.Method == "config/get" && req.Params.Prop == "plugins.plugins_dir":
				result = map[string]any{"value": ""}
			case req.Method == "config/get" && req.Params.Prop == "plugins.security":
				result = map[string]any{"value": map[string]any{"signature_mode": "permissive", "trusted_publisher_keys": []string{}}}
			case req.Method == "config/delete":
				mu.Lock()
				deleted = append(deleted, req.Params.Prop)
				mu.Unlock()
				result = map[string]any{}
			}
			resp := map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result}
			if result == nil {
				resp = map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32601, "message": "Unknown method: " + req.Method}}
			}
			raw, _ := json.Marshal(resp)
			if _, err := conn.Write(append(raw, '\n')); err != nil {
				return
			}
		}
	})
	var out bytes.Buffer
	err := pluginCmd([]string{"remove", "--purge", "--config-dir", cliData, "--socket", sock, "team-calendar"}, &out)
	if err != nil {
		t.Fatalf("remove --purge: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(filepath.Join(stackData, "plugins", "team-calendar")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the stack's plugin folder: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(stackJournal); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the stack's journal was kept: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(cliJournal); err != nil {
		t.Fatalf("the CLI's own data directory was touched: %v\n%s", err, out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deleted) != 1 || !strings.Contains(out.String(), stackData) {
		t.Fatalf("config/delete %v; output:\n%s", deleted, out.String())
	}
}

// remove keeps a memory plugin's journal so that a reinstall gets its
// memories back; `remove --purge` of a plugin removed before must still
// delete it. It failed "not installed" and left the journal for good:
// nothing else in the CLI ever deleted it.
func TestPluginPurgeAfterRemove(t *testing.T) {
	data := t.TempDir()
	plugins := filepath.Join(data, "plugins")
	socket := filepath.Join(t.TempDir(), "none.sock")
	journal := filepath.Join(data, "memories", "kv.jsonl")
	writeTestFile(t, journal, []byte(`{"op":"store","key":"YQ=="}`+"\n"))
	var out bytes.Buffer
	err := pluginCmd([]string{"remove", "--purge", "--plugins-dir", plugins, "--config-dir", data, "--socket", socket, "kv"}, &out)
	// The stack is not running: the config entry stays, and says so.
	if err == nil || !strings.Contains(err.Error(), "config entry was kept") {
		t.Fatalf("remove --purge of a removed plugin: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(journal); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the journal of a plugin removed before was kept: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "kv is not installed") {
		t.Fatalf("output does not say the plugin was not installed:\n%s", out.String())
	}
	// Without --purge, a plugin not installed is still an error.
	out.Reset()
	if err := pluginCmd([]string{"remove", "--plugins-dir", plugins, "--config-dir", data, "--socket", socket, "kv"}, &out); err == nil {
		t.Fatalf("remove of a plugin not installed succeeded:\n%s", out.String())
	}
}
