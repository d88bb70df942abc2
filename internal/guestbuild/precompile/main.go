// Command precompile compiles plugin modules into a wazero compilation
// cache the way the plugin sandbox's host does (wasmhost, its default
// configuration), so that a test binary built with the race detector
// loads them from the cache instead of compiling them with an
// instrumented compiler (internal/guestbuild, precompile.go).
//
//	precompile <cache dir> <module.wasm>...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: precompile <cache dir> <module.wasm>...")
		os.Exit(2)
	}
	if err := run(context.Background(), os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "precompile:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cacheDir string, modules []string) error {
	h, err := wasmhost.New(ctx, wasmhost.Config{CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes})
	if err != nil {
		return err
	}
	defer func() { _ = h.Close(ctx) }()
	for _, path := range modules {
		wasm, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// Loaded as a tool whatever its world: the compile writes the
		// cache entry before the exports are checked, so a module of
		// another world fails only that check, which is expected here.
		t, err := h.LoadTool(ctx, wasmhost.PluginSpec{Name: "precompile", Wasm: wasm})
		if err != nil && !errors.Is(err, wasmhost.ErrABI) {
			return fmt.Errorf("%s: %w", path, err)
		}
		if t != nil {
			_ = t.Close(ctx)
		}
	}
	return nil
}
