package wasmhost_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testdisk"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// The compilation cache only saves a later compile: a module compiled
// whose entry could not be written (a full disk, the folder removed) was
// refused as an invalid module, and discovery kept the refusal for as long
// as the plugin's files stayed the same, space back or not. It loads now,
// and a compile once there is room writes its entry again.
func TestCompilationCacheThatCannotBeWritten(t *testing.T) {
	load := func(t *testing.T, h *wasmhost.Host, name string, wasm []byte) {
		t.Helper()
		tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: name, Version: "0.1.0", Wasm: wasm})
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		defer tool.Close(context.Background())
		if _, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: []byte(`{}`)}); err != nil {
			t.Fatalf("call %s: %v", name, err)
		}
	}
	entries := func(t *testing.T, dir string) int {
		t.Helper()
		found, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
		return len(found)
	}
	host := func(t *testing.T, dir string) *wasmhost.Host {
		t.Helper()
		h, err := wasmhost.New(context.Background(), wasmhost.Config{CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close(context.Background()) })
		return h
	}

	// The folder removed while the host runs is made again: before,
	// every module compiled until a restart went uncached (and kept a
	// compiled copy in memory for good).
	t.Run("folder removed", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "cache")
		h := host(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		load(t, h, "removed", minimalTool(0))
		if n := entries(t, dir); n != 1 {
			t.Fatalf("%d cache entries after the folder was removed, want 1", n)
		}
		// Its inner, per-version folder alone, likewise.
		inner, _ := filepath.Glob(filepath.Join(dir, "*"))
		if len(inner) != 1 {
			t.Fatalf("cache folder holds %v", inner)
		}
		if err := os.RemoveAll(inner[0]); err != nil {
			t.Fatal(err)
		}
		load(t, h, "inner removed", minimalTool(1))
		if n := entries(t, dir); n != 1 {
			t.Fatalf("%d cache entries after the inner folder was removed, want 1", n)
		}
	})

	t.Run("full disk", func(t *testing.T) {
		disk := testdisk.New(t, 1<<20)
		h := host(t, disk.Dir)
		disk.Fill()
		load(t, h, "full", minimalTool(0))
		disk.Free()
		load(t, h, "room", minimalTool(1))
		if n := entries(t, disk.Dir); n != 1 {
			t.Fatalf("%d cache entries once there was room, want 1", n)
		}
	})
}
