package stack_test

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pgcluster"
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

// The stack's database server is sized for pgcluster.StackPools pools:
// as many as the processes whose service.Spec names a Schema, each of
// which keeps one.
func TestStackPoolsCountsTheServicesWithASchema(t *testing.T) {
	root := moduleRoot(t)
	schema := regexp.MustCompile(`(?m)^\s*Schema:\s*"([a-z_]+)"`)
	var with []string
	for _, p := range stack.Processes {
		src, err := os.ReadFile(filepath.Join(root, p.Package, "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		if m := schema.FindSubmatch(src); m != nil {
			with = append(with, p.Name+" ("+string(m[1])+")")
		}
	}
	if len(with) != pgcluster.StackPools {
		t.Fatalf("%d processes keep a pool on the database (%s), pgcluster.StackPools says %d: the server's connection limit is sized by it",
			len(with), strings.Join(with, ", "), pgcluster.StackPools)
	}
}
