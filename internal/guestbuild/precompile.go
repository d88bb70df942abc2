package guestbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
)

// Under the race detector wazero's compiler is instrumented with the rest
// of the test binary: a Go guest took it 13 to 15 s to compile where the
// same compiler without the detector takes 2, and with a cold cache the
// plugin packages compiled each example that way. The code it emits is
// the same either way, so a test binary built with -race has a helper
// built without it (./precompile, the sandbox's own host) compile each
// module it builds into CompileCacheDir, and its hosts load the entry.
// What a test compiles itself (a hand-assembled module, a host with
// other options) is still compiled in the test binary.

var precompiler struct {
	once sync.Once
	path string
	err  error
}

// precompile has the helper compile the module at wasm into the shared
// cache; it does nothing without the race detector, or when no package
// asked for the shared cache (CompileCacheDir), whose entries alone a
// test binary's hosts read.
func precompile(wasm string) error {
	state.mu.Lock()
	cacheDir, dir := state.cacheDir, state.dir
	state.mu.Unlock()
	if !raceEnabled || cacheDir == "" {
		return nil
	}
	precompiler.once.Do(func() {
		precompiler.path = filepath.Join(dir, "precompile")
		// wazero keys its cache folder and entries by the version it
		// reports, which a test binary, carrying no module versions,
		// reports as "dev": the helper is told the same one.
		cmd := exec.Command("go", "build", "-o", precompiler.path,
			"-ldflags=-X github.com/tetratelabs/wazero/internal/version.version="+wazeroRuntimeVersion(),
			"./internal/guestbuild/precompile")
		cmd.Dir = Root()
		if out, err := cmd.CombinedOutput(); err != nil {
			precompiler.err = fmt.Errorf("build the precompile helper: %w: %s", err, strings.TrimSpace(string(out)))
		}
	})
	if precompiler.err != nil {
		return precompiler.err
	}
	if out, err := exec.Command(precompiler.path, cacheDir, wasm).CombinedOutput(); err != nil {
		return fmt.Errorf("precompile %s: %w: %s", filepath.Base(wasm), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// wazeroRuntimeVersion is the version wazero reports in this binary
// (its internal/version.GetWazeroVersion): the wazero module's version
// in the build info, else the main module's, else "dev".
func wazeroRuntimeVersion() string {
	missing := func(v string) bool { return v == "" || v == "(devel)" }
	var v string
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if strings.Contains(dep.Path, "github.com/tetratelabs/wazero") {
				v = dep.Version
			}
		}
		if missing(v) {
			v = info.Main.Version
		}
	}
	if missing(v) {
		return "dev"
	}
	return v
}

// Precompile has a module a test made itself (an example's build,
// edited) compiled into the shared cache as the builds are, so that a
// test binary built with -race loads it from there instead of compiling
// it itself: seconds, and minutes on a loaded machine. It does nothing
// without the race detector. Call it after a build (the module is
// written beside the builds).
func Precompile(wasm []byte) error {
	state.mu.Lock()
	dir := state.dir
	state.mu.Unlock()
	if dir == "" {
		return fmt.Errorf("guestbuild: Precompile before any build")
	}
	sum := sha256.Sum256(wasm)
	path := filepath.Join(dir, "edited-"+hex.EncodeToString(sum[:8])+".wasm")
	if err := os.WriteFile(path, wasm, 0o644); err != nil {
		return fmt.Errorf("guestbuild: %w", err)
	}
	return precompile(path)
}
