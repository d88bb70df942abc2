package steptrace

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSinceWritesOneLineAStepAndNothingUnset: a step is one line of the
// process's trace with its time, and with the variable unset nothing is
// written anywhere.
func TestSinceWritesOneLineAStepAndNothingUnset(t *testing.T) {
	folder := t.TempDir()
	saved := dir
	t.Cleanup(func() {
		dir = saved
		out.mu.Lock()
		if out.f != nil {
			out.f.Close()
		}
		out.f, out.lines, out.failed = nil, 0, false
		out.mu.Unlock()
	})

	dir = ""
	Since("gateway", "chunk.call", time.Now())
	if entries, _ := os.ReadDir(folder); len(entries) != 0 {
		t.Fatalf("unset, the folder holds %d files", len(entries))
	}

	dir = folder
	Since("gateway", "chunk.call", time.Now().Add(-1500*time.Microsecond))
	Since("session", "store.sync", time.Now())
	b, err := os.ReadFile(filepath.Join(folder, fmt.Sprintf("%d.trace", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "gateway chunk.call 1.") || !strings.HasPrefix(lines[1], "session store.sync 0.") {
		t.Fatalf("trace %q", b)
	}
}

// BenchmarkSinceOff is what a traced step costs a process without
// CLAWMESH_STEP_TRACE: the caller's clock read and the test.
func BenchmarkSinceOff(b *testing.B) {
	saved := dir
	dir = ""
	defer func() { dir = saved }()
	for b.Loop() {
		Since("gateway", "chunk.call", time.Now())
	}
}
