package guestbuild

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Under the race detector a module built here is compiled into the shared
// cache by the helper built without it, where this binary's own wazero
// looks: a host of this binary then loads it from there, adding no entry
// of its own (with the helper's entries elsewhere, or none, it compiles
// the module again, for seconds, and writes its own).
func TestBuiltModuleIsPrecompiledForThisBinary(t *testing.T) {
	if !raceEnabled {
		t.Skip("the helper compiles only for binaries built with -race")
	}
	if testing.Short() {
		t.Skip("builds a guest and compiles it")
	}
	Cleanup() // a build of an earlier test would not be compiled again
	dir := t.TempDir()
	state.mu.Lock()
	state.cacheDir = dir
	state.mu.Unlock()
	t.Cleanup(func() {
		Cleanup()
		state.mu.Lock()
		state.cacheDir = ""
		state.mu.Unlock()
	})
	path, err := Wasm("echo")
	if err != nil {
		t.Fatal(err)
	}
	entries := func() []string {
		var files []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				files = append(files, p)
			}
			return nil
		})
		return files
	}
	before := entries()
	if len(before) == 0 {
		t.Fatal("the built module was not compiled into the shared cache")
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := wasmhost.New(ctx, wasmhost.Config{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close(ctx) }()
	tool, err := h.LoadTool(ctx, wasmhost.PluginSpec{Name: "echo", Wasm: wasm})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tool.Close(ctx) }()
	if after := entries(); !slices.Equal(after, before) {
		t.Fatalf("this binary compiled the module again: the cache held %v, and after its load %v", before, after)
	}
}
