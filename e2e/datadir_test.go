package e2e_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
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

// As root the cluster lives outside the data directory. Removed and
// made again by the next start, the data directory got a new, empty
// cluster, and the old one, holding every session and setting of
// before, was said only as "a postgres cluster no data directory owns
// ... start its data directory (moved?)": the directory just started.
// The start now names it as that directory's database from before and
// says what brings it back, as doctor does.
func TestDataDirMadeAgainNamesItsEarlierCluster(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("an ordinary user's cluster lives in the data directory and goes with it")
	}
	t.Parallel()
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{PrivateCluster: true, DataDir: dir})
	old := pgcluster.Dir(dir)
	if old == "" {
		t.Fatal("no cluster bound")
	}
	t.Cleanup(func() { os.RemoveAll(old) })
	s.Stop()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s = e2e.Start(t, e2e.Options{PrivateCluster: true, DataDir: dir})
	if cur := pgcluster.Dir(dir); cur == old {
		t.Fatalf("the data directory made again is bound to its old cluster %s", old)
	}
	id := strings.TrimPrefix(filepath.Base(old), "pg-")
	if !strings.Contains(s.Stderr(), "this data directory's database from before it was removed is left in its own cluster, unused") ||
		!strings.Contains(s.Stderr(), old) || !strings.Contains(s.Stderr(), "holds "+id) {
		t.Fatalf("the start did not name the earlier cluster %s:\n%s", old, s.Stderr())
	}
	out, _ := doctor(t, s.BinDir, dir)
	if !strings.Contains(out, "FAIL  stale clusters     "+old+": the cluster of "+dir+" before that directory was removed and made again") ||
		!strings.Contains(out, "put the removed directory's postgres.id, postgres.password and .secret_key back into "+dir) {
		t.Fatalf("doctor on the earlier cluster:\n%s", out)
	}
}
