package guestbuild

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WasmWith compiles the extra file into the example (the module differs
// from the plain build), builds each file and content once, and refuses a
// path where a file name belongs and a file the example already has.
func TestWasmWithAddsAFile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two guests")
	}
	defer Cleanup()
	plain, err := Wasm("echo")
	if err != nil {
		t.Fatal(err)
	}
	src := "//go:build wasip1\n\npackage main\n\nvar extraSink int\n\nfunc init() { extraSink = len(\"added by the overlay\") }\n"
	with, err := WasmWith("echo", "aa_extra.go", src)
	if err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(plain)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(with)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) {
		t.Fatal("the module built with the extra file is the plain one")
	}
	if again, err := WasmWith("echo", "aa_extra.go", src); err != nil || again != with {
		t.Fatalf("the same file again: %q, %v; want %q built once", again, err, with)
	}
	if _, err := WasmWith("echo", "../aa_extra.go", src); err == nil {
		t.Fatal("a path outside the example's folder was taken")
	}
	if _, err := WasmWith("echo", "main.go", src); err == nil {
		t.Fatal("an existing file of the example was replaced")
	}
	if _, err := os.Stat("../../plugins/examples/echo/aa_extra.go"); !os.IsNotExist(err) {
		t.Fatalf("the example's folder was written to: %v", err)
	}
}

// The shared compilation cache is the user's own directory: one another
// user could write to, or a link, is refused rather than loaded from.
func TestCompileCacheDirOnlyAPrivateOne(t *testing.T) {
	reset := func() {
		state.mu.Lock()
		state.cacheDir, state.cacheTemp = "", false
		state.mu.Unlock()
	}
	defer reset()

	base := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", base)
	reset()
	dir, err := CompileCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	version, ok := wazeroVersion()
	if !ok {
		t.Fatal("go.mod names no wazero version")
	}
	if want := filepath.Join(base, "clawmesh", "wazero-test", version); dir != want {
		t.Fatalf("dir %s, want %s", dir, want)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%v %v", fi.Mode(), err)
	}

	open := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", open)
	if err := os.MkdirAll(filepath.Join(open, "clawmesh", "wazero-test"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(open, "clawmesh", "wazero-test"), 0o777); err != nil {
		t.Fatal(err)
	}
	reset()
	if _, err := CompileCacheDir(); err == nil {
		t.Fatal("a directory every user may write to was taken")
	}

	linked := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", linked)
	if err := os.MkdirAll(filepath.Join(linked, "clawmesh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(linked, "clawmesh", "wazero-test")); err != nil {
		t.Fatal(err)
	}
	reset()
	if _, err := CompileCacheDir(); err == nil {
		t.Fatal("a link was taken for the directory")
	}
}

// Entries older than a week go, and a write's leftover after an hour;
// the rest stays.
func TestPruneCache(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	files := map[string]time.Duration{
		"fresh":         time.Hour,
		"old":           8 * 24 * time.Hour,
		"sub/old":       8 * 24 * time.Hour,
		"entry.123.tmp": 2 * time.Hour,
		"entry.456.tmp": time.Minute,
	}
	for name, age := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	pruneCache(dir, now)
	for name, kept := range map[string]bool{"fresh": true, "old": false, "sub/old": false, "entry.123.tmp": false, "entry.456.tmp": true} {
		_, err := os.Stat(filepath.Join(dir, name))
		if (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", name, err == nil, kept)
		}
	}
}

// The cache's directory is named by the wazero version go.mod requires;
// a replaced wazero has none (its code may change under one version).
func TestWazeroVersionIn(t *testing.T) {
	for _, tc := range []struct {
		gomod, want string
		ok          bool
	}{
		{"module m\n\nrequire (\n\tgithub.com/tetratelabs/wazero v1.12.0\n\tgo.uber.org/zap v1.27.0\n)\n", "v1.12.0", true},
		{"module m\nrequire github.com/tetratelabs/wazero v1.9.0 // indirect\n", "v1.9.0", true},
		{"module m\nrequire github.com/tetratelabs/wazero v1.12.0\nreplace github.com/tetratelabs/wazero => ../wazero\n", "", false},
		{"module m\nrequire github.com/tetratelabs/wazero v1.12.0\nreplace (\n\tgithub.com/tetratelabs/wazero v1.12.0 => example.com/fork v1.0.0\n)\n", "", false},
		{"module m\nrequire github.com/tetratelabs/wazerox v1.0.0\n", "", false},
		{"module m\nrequire github.com/tetratelabs/wazero ../x\n", "", false},
	} {
		got, ok := wazeroVersionIn([]byte(tc.gomod))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %q %v, want %q %v", tc.gomod, got, ok, tc.want, tc.ok)
		}
	}
}
