package e2e_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// A data directory removed while the stack runs: the launcher ran on with
// no client able to reach it (the socket's path gone), and the fix doctor
// named, clawmesh up, started a second stack beside it on the same path.
// It stops the stack now, exits 1 and says why and what to do.
func TestDataDirRemovedStopsTheStack(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	if err := os.RemoveAll(s.DataDir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Exited():
	case <-time.After(60 * time.Second):
		t.Fatalf("the launcher still runs 60 s after its data directory was removed:\n%s", s.Stderr())
	}
	if code := s.ExitCode(); code != 1 || !strings.Contains(s.Stderr(), "data directory removed while the stack ran: "+s.DataDir) ||
		!strings.Contains(s.Stderr(), "clawmesh up --config-dir "+s.DataDir) {
		t.Fatalf("exit %d after the data directory was removed:\n%s", code, s.Stderr())
	}
}
