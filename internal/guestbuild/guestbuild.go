// Package guestbuild builds the example plugins under plugins/examples for
// tests, with the standard Go toolchain (GOOS=wasip1 GOARCH=wasm,
// -buildmode=c-shared), once per process, and installs them the way an
// installed plugin looks: <dir>/<name>/plugin.wasm next to manifest.toml.
package guestbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

var state struct {
	mu     sync.Mutex
	dir    string
	builds map[string]*build

	cacheDir  string // CompileCacheDir's
	cacheTemp bool   // cacheDir is temporary: Cleanup removes it
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Root is the repository root.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Wasm builds plugins/examples/<name> on first use and returns the path of
// its .wasm; later calls, from any goroutine, reuse it.
func Wasm(name string) (string, error) { return wasm(name, "", "") }

// WasmWith builds plugins/examples/<name> with one more source file in its
// folder, file holding src, added through go build's -overlay (the folder
// is not touched); each file and content is built once, as Wasm's.
// Benchmarks use it to move the example's code to other offsets.
func WasmWith(name, file, src string) (string, error) {
	if file == "" || filepath.Base(file) != file {
		return "", fmt.Errorf("build guest %s: %q is not a file name", name, file)
	}
	// An overlay of a file that exists would replace it, not add one.
	if _, err := os.Stat(filepath.Join(Root(), "plugins", "examples", name, file)); err == nil {
		return "", fmt.Errorf("build guest %s: %s exists; WasmWith adds a file", name, file)
	}
	return wasm(name, file, src)
}

func wasm(name, file, src string) (string, error) {
	key := name
	if file != "" {
		sum := sha256.Sum256([]byte(file + "\x00" + src))
		key = name + "-" + hex.EncodeToString(sum[:8])
	}
	state.mu.Lock()
	if state.dir == "" {
		dir, err := os.MkdirTemp("", "clawmesh-guests-")
		if err != nil {
			state.mu.Unlock()
			return "", err
		}
		state.dir, state.builds = dir, map[string]*build{}
	}
	b, ok := state.builds[key]
	if !ok {
		b = &build{path: filepath.Join(state.dir, key+".wasm")}
		state.builds[key] = b
	}
	dir := state.dir
	state.mu.Unlock()
	b.once.Do(func() {
		args := []string{"build", "-buildmode=c-shared", "-o", b.path}
		if file != "" {
			extra := filepath.Join(dir, key+".go")
			overlay := filepath.Join(dir, key+".overlay.json")
			spec, err := json.Marshal(map[string]map[string]string{"Replace": {
				filepath.Join(Root(), "plugins", "examples", name, file): extra}})
			if err == nil {
				err = os.WriteFile(extra, []byte(src), 0o644)
			}
			if err == nil {
				err = os.WriteFile(overlay, spec, 0o644)
			}
			if err != nil {
				b.err = fmt.Errorf("build guest %s: %w", name, err)
				return
			}
			args = append(args, "-overlay", overlay)
		}
		cmd := exec.Command("go", append(args, "./plugins/examples/"+name)...)
		cmd.Dir = Root()
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build guest %s: %w: %s", name, err, strings.TrimSpace(string(out)))
			return
		}
		b.err = precompile(b.path)
	})
	return b.path, b.err
}

// Install builds the example and copies it into dir/<name>/ with its
// manifest.
func Install(dir, name string) error {
	wasm, err := Wasm(name)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for src, to := range map[string]string{
		wasm: filepath.Join(dst, "plugin.wasm"),
		filepath.Join(Root(), "plugins", "examples", name, "manifest.toml"): filepath.Join(dst, "manifest.toml"),
	} {
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(to, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Cleanup removes the built guests and a temporary compilation cache;
// call it from TestMain after m.Run.
func Cleanup() {
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.dir != "" {
		os.RemoveAll(state.dir)
		state.dir, state.builds = "", nil
		// The precompile helper was built into that folder.
		precompiler.once, precompiler.path, precompiler.err = sync.Once{}, "", nil
	}
	if state.cacheTemp {
		os.RemoveAll(state.cacheDir)
		state.cacheDir, state.cacheTemp = "", false
	}
}
