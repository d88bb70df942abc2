package guestbuild

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// cacheMaxAge is how long a compiled module stays in the shared cache:
// entries are written once and never touched again, so a week after it
// was compiled a module is compiled anew, and what old examples and old
// wazero versions left behind goes.
const cacheMaxAge = 7 * 24 * time.Hour

// CompileCacheMaxBytes is the bound the suite's hosts keep
// CompileCacheDir in (wasmhost.Config.CacheMaxBytes): far above what one
// run compiles (about 30 modules of up to 16 MB), so that no host trims
// an entry another package compiled in the same run, and a recompile under
// the race detector costs seconds; still a bound on a developer's cache.
const CompileCacheMaxBytes = 4 << 30

// CompileCacheDir returns the directory of wazero's compilation cache
// the test binaries of the suite share, across packages and runs.
// Compiling a Go guest takes wazero's compiler 13 to 15 s when the
// race detector instruments it (2 s without), the plugin packages
// compile the same examples, and a module compiles to the same code
// every time: wazero keys an entry by the module's hash and the CPU's
// features, so an entry is never used for another module.
//
// wazero also keys it by its own version, but a test binary carries no
// module versions and wazero then calls itself "dev": the directory is
// therefore one per wazero version that go.mod requires
// (<cache>/clawmesh/wazero-test/<version>), so that code compiled by one
// release is never loaded by another, and a temporary one when go.mod
// replaces wazero (its code may change under the same version).
//
// It lives in the user's cache directory, not in /tmp, where another
// account could put compiled code there for the tests to load and run;
// a directory that is not this user's alone is refused. Without a cache
// directory (no HOME) it is a temporary one; Cleanup removes a
// temporary one.
func CompileCacheDir() (string, error) {
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.cacheDir != "" {
		return state.cacheDir, nil
	}
	base, err := os.UserCacheDir()
	version, ok := wazeroVersion()
	if err != nil || !ok {
		dir, err := os.MkdirTemp("", "clawmesh-wazero-test-")
		if err != nil {
			return "", err
		}
		state.cacheDir, state.cacheTemp = dir, true
		return dir, nil
	}
	top := filepath.Join(base, "clawmesh", "wazero-test")
	dir := filepath.Join(top, version)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("compilation cache: %w", err)
	}
	for _, d := range []string{top, dir} {
		if err := ownedPrivateDir(d); err != nil {
			return "", fmt.Errorf("compilation cache: %w", err)
		}
	}
	pruneCache(top, time.Now())
	state.cacheDir = dir
	return dir, nil
}

// wazeroVersion is the version of wazero go.mod requires; ok is false
// when go.mod cannot be read, names none, or replaces it.
func wazeroVersion() (version string, ok bool) {
	raw, err := os.ReadFile(filepath.Join(Root(), "go.mod"))
	if err != nil {
		return "", false
	}
	return wazeroVersionIn(raw)
}

func wazeroVersionIn(gomod []byte) (version string, ok bool) {
	const path = "github.com/tetratelabs/wazero"
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "require" || f[0] == "replace") {
			f = f[1:] // the one-line form of a directive
		}
		if len(f) < 2 || f[0] != path {
			continue
		}
		if slices.Contains(f, "=>") {
			return "", false // replaced: not a released version's code
		}
		version = f[1]
	}
	if !strings.HasPrefix(version, "v") || strings.ContainsAny(version, `/\`) {
		return "", false
	}
	return version, true
}

// ownedPrivateDir checks that dir is a directory (not a link to one)
// owned by this user that no other user may write to.
func ownedPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case !ok || int(st.Uid) != os.Getuid():
		return fmt.Errorf("%s is not owned by this user", dir)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s may be written by other users (mode %v)", dir, fi.Mode().Perm())
	}
	return nil
}

// pruneCache removes entries compiled more than cacheMaxAge before now,
// and files an interrupted write left (wazero writes an entry to a
// temporary file, then renames it) after an hour. Errors are ignored: a
// file that cannot be removed costs disk space, not correctness.
func pruneCache(dir string, now time.Time) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		age := now.Sub(fi.ModTime())
		if age > cacheMaxAge || (strings.HasSuffix(path, ".tmp") && age > time.Hour) {
			_ = os.Remove(path)
		}
		return nil
	})
}
