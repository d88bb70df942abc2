package pgcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"
)

// serve runs p's server until the test ends (or stop is called) and
// returns once it accepts connections.
func serve(t *testing.T, ctx context.Context, p *Prepared) (stop func()) {
	t.Helper()
	cmd := p.Command()
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = func() {
		select {
		case <-done:
			return
		default:
		}
		_ = cmd.Process.Signal(ShutdownSignal)
		<-done
	}
	t.Cleanup(stop)
	for {
		if _, err := p.Probe(ctx); err == nil {
			return stop
		} else {
			select {
			case <-done:
				t.Fatalf("server exited: %v", err)
			case <-ctx.Done():
				t.Fatalf("server not ready: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// A data directory of a version before clusters were bound by id (run
// as root) has its cluster at RootClusters/pg-<sha256 of its path>, with
// no owner record, trusting its socket. The first start of this version
// removed it as stale and made an empty cluster in its place, with only
// an info line: every session and setting was gone. The start adopts it
// instead: bound by a new id, its data kept, and its socket no longer
// trusted (the server's account is shared: only the generated password
// gets in).
func TestEarlierVersionsClusterIsAdopted(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL selects an external server")
	}
	_, data := rootDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	log := zaptest.NewLogger(t)

	// The earlier version's cluster, as it made it: initdb --auth=trust
	// as the server's account, in the folder named after the path.
	legacy := filepath.Join(RootClusters, legacyName(data))
	t.Cleanup(func() { os.RemoveAll(legacy) })
	bin, err := findBinaries()
	if err != nil {
		t.Skip(err)
	}
	cred, err := runAs()
	if err != nil {
		t.Fatal(err)
	}
	if err := prepareDir(legacy, cred); err != nil {
		t.Fatal(err)
	}
	old := &Prepared{dir: legacy, bin: bin, cred: cred, fast: true, maxConns: 20}
	if err := old.initdb(ctx, dataDir(legacy), log); err != nil {
		t.Fatal(err)
	}
	old.created = true
	stopOld := serve(t, ctx, old)
	if err := old.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	execSQL(t, ctx, old.URL(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
	stopOld()

	// This version's start, as the launcher does it.
	for _, removed := range Collect(data, log) {
		if removed == legacy {
			t.Errorf("the earlier version's cluster %s was collected", legacy)
		}
	}
	dir, err := Bind(data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if Dir(data) != dir {
		t.Fatalf("bound %s, Dir says %s", dir, Dir(data))
	}
	p, err := Prepare(ctx, Options{Dir: dir, Fast: true, Log: log, MaxConnections: 20,
		PasswordFile: filepath.Join(data, "postgres.password")})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ctx, p)
	if err := p.EnsureDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
		t.Fatalf("the earlier version's data after the upgrade: %d %v", v, err)
	}
	if p.password == "" || !strings.Contains(p.URL(), ":"+p.password+"@") {
		t.Fatal("the adopted cluster has no password")
	}
	noPW := strings.Replace(p.URL(), ":"+p.password+"@", "@", 1)
	if c, err := pgx.Connect(ctx, noPW); err == nil {
		c.Close(ctx)
		t.Fatal("the adopted cluster still trusts its socket")
	}
	// Adopted, it is an ordinary bound cluster: another start keeps it.
	if removed := Collect(data, log); contains(removed, dir) {
		t.Fatalf("the adopted cluster %s was collected", dir)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("the earlier version's folder is still there: %v", err)
	}
}
