package manifest_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// TestLoadBundleRefusesModuleThroughLinkedFolder: every folder on the
// way to wasm_path must be a folder, not a link to one, whether the link
// leads out of the plugin or not; a real folder is fine.
func TestLoadBundleRefusesModuleThroughLinkedFolder(t *testing.T) {
	const wasm = "\x00asm\x01\x00\x00\x00"
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "x.wasm"), []byte(wasm), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{"real/lib", "in/real"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"real/lib/x.wasm", "in/real/x.wasm"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(wasm), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "in", "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		wasmPath string
		ok       bool
	}{
		{"out/x.wasm", false},
		{"in/link/x.wasm", false},
		{"real/lib/x.wasm", true},
	} {
		t.Run(c.wasmPath, func(t *testing.T) {
			doc := "name = \"p\"\nversion = \"1.0.0\"\nwasm_path = \"" + c.wasmPath + "\"\ncapabilities = [\"tool\"]\n"
			if err := os.WriteFile(filepath.Join(dir, manifest.FileName), []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			b, err := manifest.LoadBundle(dir)
			if !c.ok {
				if !errors.Is(err, manifest.ErrLayout) {
					t.Fatalf("LoadBundle = %v, want ErrLayout", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if data, err := b.ReadModule(); err != nil || string(data) != wasm {
				t.Fatalf("ReadModule = %q, %v", data, err)
			}
		})
	}
}
