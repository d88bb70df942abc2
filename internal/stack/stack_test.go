package stack_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/clawmesh/clawmesh/internal/stack"
)

func moduleRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Every package the table names builds a binary of the process's name.
func TestPackagesNameTheirBinaries(t *testing.T) {
	root := moduleRoot(t)
	for _, p := range append([]stack.Process{stack.CLI}, stack.Processes...) {
		if filepath.Base(p.Package) != p.Name {
			t.Errorf("%s: package %s builds a binary of another name", p.Name, p.Package)
		}
		if _, err := os.Stat(filepath.Join(root, p.Package, "main.go")); err != nil {
			t.Errorf("%s: %v", p.Name, err)
		}
		if p.Role == "" {
			t.Errorf("%s has no bus role", p.Name)
		}
	}
}
