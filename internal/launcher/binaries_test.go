package launcher

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/stack"
)

// clawmesh built alone (go build ./cmd/clawmesh, no make build) found the
// service binaries missing only once PostgreSQL had been initialised and
// started and the bus credentials written; the start is refused now
// before any of it, naming the first binary missing and what to do.
func TestMissingBinaryRefusedBeforeAnythingStarts(t *testing.T) {
	dir, bin := privateDir(t), stubBinaries(t)
	first := stack.Processes[0].Name
	if err := os.Remove(filepath.Join(bin, first)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Run(ctx, Config{DataDir: dir, BinDir: bin})
	if err == nil || !strings.Contains(err.Error(), first+" binary") || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("Run without the %s binary: %v", first, err)
	}
	for _, left := range []string{"postgres.id", "postgres", "bus"} {
		if _, err := os.Stat(filepath.Join(dir, left)); err == nil {
			t.Errorf("%s was made before the start was refused", left)
		}
	}
}
