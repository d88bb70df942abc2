package e2e_test

import (
	"os"
	"os/exec"
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
// made again, the data directory starts empty, as an ordinary user's
// does (removing it is how one starts afresh); its old cluster, holding
// every session and setting of before, could not be used again, since
// its role's password and the secrets key went with the directory. They
// are kept beside the cluster now, and the start names the one command
// that brings it back: run with the stack stopped, the settings and the
// secrets key are back.
func TestDataDirMadeAgainCanGetItsDatabaseBack(t *testing.T) {
	s, dir, old, id := rootStack(t)
	if out, err := clawmesh(t, s, "config", "set", "agents.default.system_prompt=kept across", "agents.default.api_key=sk-kept"); err != nil {
		t.Fatalf("config set: %v\n%s", err, out)
	}
	key, err := os.ReadFile(filepath.Join(dir, ".secret_key"))
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s = e2e.Start(t, e2e.Options{PrivateCluster: true, DataDir: dir})
	fresh := pgcluster.Dir(dir)
	t.Cleanup(func() { os.RemoveAll(fresh); os.RemoveAll(filepath.Join(pgcluster.RootKeys, filepath.Base(fresh))) })
	if fresh == old || fresh == "" {
		t.Fatalf("the data directory made again is bound to %q, not to a cluster of its own (old %s)", fresh, old)
	}
	if out, err := clawmesh(t, s, "config", "get", "agents.default.system_prompt"); err != nil || strings.Contains(out, "kept across") {
		t.Fatalf("a setting of before came back unasked: %q %v", out, err)
	}
	keys := filepath.Join(pgcluster.RootKeys, "pg-"+id)
	fix := "cp " + keys + "/postgres.password " + keys + "/.secret_key " + dir + "/ && echo " + id + " > " + dir + "/postgres.id"
	if !strings.Contains(s.Stderr(), old) || !strings.Contains(s.Stderr(), "'"+fix+"'") {
		t.Fatalf("the start did not name the command that brings %s back:\n%s", old, s.Stderr())
	}
	s.Stop()
	if out, err := exec.Command("sh", "-c", fix).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", fix, err, out)
	}
	s = e2e.Start(t, e2e.Options{PrivateCluster: true, DataDir: dir})
	if cur := pgcluster.Dir(dir); cur != old {
		t.Fatalf("after the named command the data directory is bound to %s, not to its cluster from before %s", cur, old)
	}
	if out, err := clawmesh(t, s, "config", "get", "agents.default.system_prompt"); err != nil || strings.TrimSpace(out) != `"kept across"` {
		t.Fatalf("a setting of before, after the named command: %q %v", out, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, ".secret_key")); err != nil || string(got) != string(key) {
		t.Fatalf("the secrets key is not the one of before (%v)", err)
	}
}

// A cluster made by a version that kept its credentials only in the data
// directory cannot be re-attached once that directory is removed: the
// start names it as that directory's database from before and gives the
// commands that bring it back from a backup, as doctor does.
func TestDataDirMadeAgainNamesItsEarlierCluster(t *testing.T) {
	s, dir, old, id := rootStack(t)
	s.Stop()
	// Made the old way: nothing kept beside the cluster.
	if err := os.RemoveAll(filepath.Join(pgcluster.RootKeys, "pg-"+id)); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s = e2e.Start(t, e2e.Options{PrivateCluster: true, DataDir: dir})
	cur := pgcluster.Dir(dir)
	if cur == old {
		t.Fatalf("the data directory made again is bound to its old cluster %s", old)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(pgcluster.RootKeys, filepath.Base(cur))) })
	fix := "'cp BACKUP/postgres.password BACKUP/.secret_key " + dir + "/ && echo " + id + " > " + dir + "/postgres.id'"
	if !strings.Contains(s.Stderr(), "this data directory's database from before it was removed is left in its own cluster, unused") ||
		!strings.Contains(s.Stderr(), old) || !strings.Contains(s.Stderr(), fix) {
		t.Fatalf("the start did not name the earlier cluster %s:\n%s", old, s.Stderr())
	}
	out, _ := doctor(t, s.BinDir, dir)
	if !strings.Contains(out, "FAIL  stale clusters     "+old+": the cluster of "+dir+" before that directory was removed and made again") ||
		!strings.Contains(out, fix) {
		t.Fatalf("doctor on the earlier cluster:\n%s", out)
	}
}

// rootStack starts a root stack on a private cluster of a new data
// directory and returns it, the directory, its cluster's folder and id;
// the cluster and its kept credentials go at the test's end. It skips
// for an ordinary user, whose cluster lives in the data directory.
func rootStack(t *testing.T) (s *e2e.Stack, dir, cluster, id string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("an ordinary user's cluster lives in the data directory and goes with it")
	}
	t.Parallel()
	dir = e2e.TempDataDir(t)
	s = e2e.Start(t, e2e.Options{PrivateCluster: true, DataDir: dir})
	cluster = pgcluster.Dir(dir)
	if cluster == "" {
		t.Fatal("no cluster bound")
	}
	id = strings.TrimPrefix(filepath.Base(cluster), "pg-")
	t.Cleanup(func() { os.RemoveAll(cluster); os.RemoveAll(filepath.Join(pgcluster.RootKeys, "pg-"+id)) })
	return s, dir, cluster, id
}

// Root's start kept the cluster's credentials beside it twice, each time
// reading the data directory's id and both files and the kept copies:
// once after PostgreSQL was prepared (the secrets key not made yet on a
// first start) and again once the config service served. Kept once
// now, when both exist and the stack is up: the launcher says so once.
func TestRootCredentialsKeptOnceAStart(t *testing.T) {
	s, dir, _, id := rootStack(t)
	const said = "kept the cluster's password and secrets key beside it"
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.Stderr(), said) {
		if time.Now().After(deadline) {
			t.Fatalf("the launcher never said it kept the credentials:\n%s", s.Stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(s.Stderr(), said); n != 1 {
		t.Fatalf("credentials kept %d times in one start:\n%s", n, s.Stderr())
	}
	for _, name := range []string{pgcluster.DataDirPasswordFile, ".secret_key"} {
		mine, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		kept, err := os.ReadFile(filepath.Join(pgcluster.RootKeys, "pg-"+id, name))
		if err != nil || string(kept) != string(mine) {
			t.Fatalf("%s not kept as the data directory holds it: %v", name, err)
		}
	}
}
