// Package e2e helps end-to-end tests: it builds the real binaries once per
// test process, runs `clawmesh up` on a temporary data directory, and
// speaks NDJSON to the socket as a client would.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/clawmesh/clawmesh/internal/stack"
)

var built struct {
	once sync.Once
	dir  string
	err  error
}

// BinDir builds the binaries (once per process) into a temporary folder
// and returns it. The folder is removed by Cleanup.
func BinDir() (string, error) {
	built.once.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			built.err = err
			return
		}
		dir, err := os.MkdirTemp("", "clawmesh-bin-")
		if err != nil {
			built.err = err
			return
		}
		args := append([]string{"build", "-o", dir + "/"}, stack.Packages()...)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		built.dir = dir
	})
	return built.dir, built.err
}

// Cleanup removes the built binaries and the compiled plugins
// (SeedCompiled); call it from TestMain after m.Run.
func Cleanup() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	cleanupCompiled()
}

func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the module root")
	}
	// This file is internal/e2e/build.go.
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}
