package wasmhost_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// The compilation cache's folder stays in its bound across hosts: a new
// host removes the entries no host has used since it started once the
// folder is past the bound, and a temporary file a killed compile left,
// and keeps what it compiles itself.
func TestCompilationCacheStaysInItsBound(t *testing.T) {
	dir := t.TempDir()
	entries := func() []string {
		t.Helper()
		var names []string
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				names = append(names, d.Name())
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	load := func(h *wasmhost.Host, name string, wasm []byte) {
		t.Helper()
		tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: name, Version: "0.1.0", Wasm: wasm})
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		_ = tool.Close(context.Background())
	}
	host := func() *wasmhost.Host {
		t.Helper()
		h, err := wasmhost.New(context.Background(), wasmhost.Config{CacheDir: dir, CacheMaxBytes: 1})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	first := host()
	load(first, "one", minimalTool(0))
	load(first, "two", minimalTool(1))
	if got := entries(); len(got) != 2 {
		t.Fatalf("after two compiles, past the bound but both in use: %v", got)
	}
	_ = first.Close(context.Background())
	was := entries()
	// An hour later, with a compile killed while it wrote its entry.
	var sub string
	old := time.Now().Add(-time.Hour)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			sub = filepath.Dir(path)
			err = os.Chtimes(path, old, old)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tempPath := filepath.Join(sub, was[0]+".4242.tmp")
	if err := os.WriteFile(tempPath, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tempPath, old, old); err != nil {
		t.Fatal(err)
	}

	second := host()
	defer second.Close(context.Background())
	if got := entries(); len(got) != 0 {
		t.Fatalf("a new host past the bound kept %v", got)
	}
	load(second, "three", minimalTool(2))
	got := entries()
	if len(got) != 1 || strings.HasSuffix(got[0], ".tmp") || got[0] == was[0] || got[0] == was[1] {
		t.Fatalf("after the new host's compile: %v (the first host's: %v)", got, was)
	}
}
