package main

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func writeTestFile(t *testing.T, p string, body []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, body, 0o644); err != nil {
		t.Fatal(err)
	}
}

const calendarManifest = "name = \"team-calendar\"\nversion = \"0.2.0\"\nwasm_path = \"plugin.wasm\"\ncapabilities = [\"tool\"]\n"

// testRegistry publishes team-calendar 0.2.0 with module body and returns
// the index's path.
func testRegistry(t *testing.T, module string) string {
	t.Helper()
	dir := t.TempDir()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range [][2]string{{"manifest.toml", calendarManifest}, {"plugin.wasm", module}} {
		w, err := zw.Create(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(dir, "tc.zip"), buf.Bytes())
	sum := sha256.Sum256(buf.Bytes())
	raw, err := json.Marshal(map[string]any{"plugins": []map[string]any{{"name": "team-calendar", "version": "0.2.0",
		"url": "tc.zip", "sha256": "sha256:" + hex.EncodeToString(sum[:])}}})
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(dir, "registry.json"), raw)
	return filepath.Join(dir, "registry.json")
}

// TestPluginInstallSourceBySpelling: a bare NAME is the registry's even
// when the current directory (a shared one, say) holds a folder of that
// name; ./NAME is that folder.
func TestPluginInstallSourceBySpelling(t *testing.T) {
	index := testRegistry(t, "registry module")
	cwd := t.TempDir()
	writeTestFile(t, filepath.Join(cwd, "team-calendar", "manifest.toml"), []byte(calendarManifest))
	writeTestFile(t, filepath.Join(cwd, "team-calendar", "plugin.wasm"), []byte("module in the current directory"))
	t.Chdir(cwd)
	socket := filepath.Join(t.TempDir(), "none.sock")
	for _, c := range []struct{ source, want string }{
		{"team-calendar", "registry module"},
		{"./team-calendar", "module in the current directory"},
		{"team-calendar/manifest.toml", "module in the current directory"},
	} {
		t.Run(c.source, func(t *testing.T) {
			plugins := filepath.Join(t.TempDir(), "plugins")
			var out bytes.Buffer
			if err := pluginCmd([]string{"install", "--registry", index, "--plugins-dir", plugins, "--socket", socket, c.source}, &out); err != nil {
				t.Fatalf("install %s: %v\n%s", c.source, err, out.String())
			}
			got, err := os.ReadFile(filepath.Join(plugins, "team-calendar", "plugin.wasm"))
			if err != nil || string(got) != c.want {
				t.Fatalf("install %s installed the module %q (%v), want %q", c.source, got, err, c.want)
			}
		})
	}
}
