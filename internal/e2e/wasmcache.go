package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Each stack's plugin sandbox compiles its plugins into a compilation
// cache of its data directory's (<data_dir>/wasm-cache), and every test
// stack has a data directory of its own: the e2e package compiled the
// same few example modules once a stack, about two seconds of CPU each
// (two replicas: one compiles, the other waits for it). SeedCompiled has
// each module compiled once a process, by the sandbox's own host
// (internal/guestbuild/precompile, built as the stack's binaries are, so
// that wazero reports the same version and names its cache folder and
// entries the same), and puts the entry into a data directory's cache
// before its stack starts: the sandbox then loads the plugin from the
// cache as it would on any start after its first.

var compiled struct {
	mu      sync.Mutex
	dir     string // the helper and one cache folder a module
	helper  string
	err     error             // building the helper
	modules map[string]*entry // by the module's hash
}

type entry struct {
	once sync.Once
	dir  string // a wazero cache holding this module's entry alone
	err  error
}

// SeedCompiled puts into dataDir's compilation cache the entries the
// stack's plugin sandbox writes when it compiles each module at the
// given paths (the .wasm files of installed plugins), compiling each
// module once a process. A test that asserts what the sandbox compiles
// on an empty cache does not call it.
func SeedCompiled(dataDir string, wasms ...string) error {
	for _, wasm := range wasms {
		src, err := compiledEntry(wasm)
		if err != nil {
			return fmt.Errorf("seed the compilation cache: %w", err)
		}
		if err := linkTree(src, filepath.Join(dataDir, "wasm-cache")); err != nil {
			return fmt.Errorf("seed the compilation cache: %w", err)
		}
	}
	return nil
}

// compiledEntry returns a cache folder holding wasm's entry alone,
// compiling it on first use.
func compiledEntry(wasm string) (string, error) {
	data, err := os.ReadFile(wasm)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	key := hex.EncodeToString(sum[:])
	helper, dir, err := precompileHelper()
	if err != nil {
		return "", err
	}
	compiled.mu.Lock()
	e, ok := compiled.modules[key]
	if !ok {
		e = &entry{dir: filepath.Join(dir, key[:16])}
		compiled.modules[key] = e
	}
	compiled.mu.Unlock()
	e.once.Do(func() {
		if out, err := exec.Command(helper, e.dir, wasm).CombinedOutput(); err != nil {
			e.err = fmt.Errorf("precompile %s: %w: %s", filepath.Base(wasm), err, strings.TrimSpace(string(out)))
		}
	})
	return e.dir, e.err
}

// precompileHelper builds internal/guestbuild/precompile once a process
// and returns it and the folder the modules' caches go in. It is built
// by `go build` in the module, as BinDir builds the stack: wazero reads
// its version from the binary's build information, and an entry written
// under another version is neither found nor loaded.
func precompileHelper() (helper, dir string, err error) {
	compiled.mu.Lock()
	defer compiled.mu.Unlock()
	if compiled.helper != "" || compiled.err != nil {
		return compiled.helper, compiled.dir, compiled.err
	}
	root, err := moduleRoot()
	if err != nil {
		compiled.err = err
		return "", "", err
	}
	d, err := os.MkdirTemp("", "clawmesh-e2e-wasm-")
	if err != nil {
		compiled.err = err
		return "", "", err
	}
	path := filepath.Join(d, "precompile")
	cmd := exec.Command("go", "build", "-o", path, "./internal/guestbuild/precompile")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(d)
		compiled.err = fmt.Errorf("build the precompile helper: %w: %s", err, strings.TrimSpace(string(out)))
		return "", "", compiled.err
	}
	compiled.dir, compiled.helper, compiled.modules = d, path, map[string]*entry{}
	return path, d, nil
}

// linkTree puts every file under src at the same place under dst, as a
// hard link (a copy across file systems), making folders 0700 as wazero
// does. A link is safe: wazero writes an entry into a temporary file it
// renames and never writes one in place, and removing an entry (the
// sandbox's trim, a stale one) removes the link alone.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		if err := os.Link(path, to); err == nil || errors.Is(err, fs.ErrExist) {
			return nil
		}
		return copyFile(path, to)
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// cleanupCompiled removes the helper and the modules' caches.
func cleanupCompiled() {
	compiled.mu.Lock()
	defer compiled.mu.Unlock()
	if compiled.dir != "" {
		os.RemoveAll(compiled.dir)
	}
	compiled.dir, compiled.helper, compiled.err, compiled.modules = "", "", nil, nil
}
