package stack_test

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

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

// docker-compose.yml runs exactly the processes of the table, each with
// its own binary as the command.
func TestComposeRunsTheTable(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(moduleRoot(t), "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Command []string `json:"command"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	var running []string
	for name, svc := range doc.Services {
		if len(svc.Command) == 0 {
			continue // an image's own server: postgres, nats
		}
		p, ok := stack.Lookup(name)
		if !ok {
			t.Errorf("compose service %s runs %v, which the stack table does not list", name, svc.Command)
			continue
		}
		if svc.Command[0] != p.Name {
			t.Errorf("compose service %s runs %s, want the %s binary", name, strings.Join(svc.Command, " "), p.Name)
		}
		running = append(running, name)
	}
	for _, p := range stack.Processes {
		if !slices.Contains(running, p.Name) {
			t.Errorf("docker-compose.yml does not run %s", p.Name)
		}
	}
}
