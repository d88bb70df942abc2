package pgcluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A cluster keeps its data across a stop and a start on the same folder,
// and leaves no server behind.
func TestClusterPersistsAcrossRestart(t *testing.T) {
	ctx, opts := newCluster(t)
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, ctx, c.URL(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
	c.Stop()
	c.Stop() // twice is fine
	select {
	case <-c.Done():
	default:
		t.Fatal("server still running after Stop")
	}
	if _, err := pgx.Connect(ctx, c.URL()); err == nil {
		t.Fatal("connected to a stopped cluster")
	}

	c2, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Stop()
	conn, err := pgx.Connect(ctx, c2.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 42 {
		t.Fatalf("after restart: %d %v", v, err)
	}
	// Unix socket only: nothing listens on TCP.
	var addr *string
	if err := conn.QueryRow(ctx, "SELECT current_setting('listen_addresses')").Scan(&addr); err != nil || *addr != "" {
		t.Fatalf("listen_addresses %v %v", addr, err)
	}
}

// A new cluster's clawmesh database is initdb's "postgres" database
// renamed, not a copy of template1 made on the first run's critical path;
// a cluster that lost its clawmesh database gets a new one on its next
// start.
func TestNewClusterRenamesInitdbsDatabase(t *testing.T) {
	ctx, opts := newCluster(t)
	// The second start finds the clawmesh database dropped at the end of
	// the first, and postgres long renamed: it creates one.
	for _, when := range []string{"a new cluster", "a cluster whose clawmesh database was dropped"} {
		c, err := pgcluster.Start(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := databases(t, ctx, c.AdminURL()); got != "clawmesh,template0,template1" {
			c.Stop()
			t.Fatalf("databases of %s: %s", when, got)
		}
		exec(t, ctx, c.URL(), "CREATE TABLE t (v int)")
		exec(t, ctx, c.AdminURL(), "DROP DATABASE clawmesh")
		c.Stop()
	}
}

// A stack's server takes what the stack's pools hold at their fullest
// (each opened as a service opens it, pg.Open, at its size), with the
// launcher's probe and an operator's connection beside them: its limit
// is sized for them, not set at 300 for every start to pay.
func TestStackServerFitsItsPools(t *testing.T) {
	ctx, opts := newCluster(t)
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	var limit int
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SELECT current_setting('max_connections')::int").Scan(&limit); err != nil {
		t.Fatal(err)
	}
	if limit != pgcluster.StackConnections() {
		t.Fatalf("max_connections %d, want StackConnections() = %d", limit, pgcluster.StackConnections())
	}
	var held []*pgxpool.Conn
	var pools []*pgxpool.Pool
	defer func() {
		for _, h := range held {
			h.Release()
		}
		for _, p := range pools {
			p.Close() // waits for its connections' release
		}
	}()
	for i := range pgcluster.StackPools {
		// The pool a service opens (pg.Open), at the size it opens it.
		pool, err := pg.Open(ctx, c.URL(), fmt.Sprintf("pool_%d", i), nil, testenv.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		pools = append(pools, pool)
		for range pool.Config().MaxConns {
			h, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatalf("pool %d at %d connections: %v", i+1, len(held), err)
			}
			held = append(held, h)
		}
	}
	if answered, err := c.Probe(ctx); err != nil || !answered {
		t.Fatalf("the launcher's probe beside full pools: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < len(held)+1 {
		t.Fatalf("%d client backends for %d held connections", n, len(held)+1)
	}
}

// newCluster gives a test a folder for a cluster of its own, removed when
// it ends, and a context bounding the test; it skips the test when
// DATABASE_URL selects an external server.
func newCluster(t *testing.T) (context.Context, pgcluster.Options) {
	t.Helper()
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL selects an external server")
	}
	dir, err := os.MkdirTemp("", "cm-pgc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx, pgcluster.Options{Dir: dir, Fast: true, Log: testenv.Logger(t)}
}

func databases(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var names string
	if err := conn.QueryRow(ctx, "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database").Scan(&names); err != nil {
		t.Fatal(err)
	}
	return names
}

func exec(t *testing.T, ctx context.Context, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

// An initdb cut short (killed with the launcher, or the machine
// stopped) leaves nothing the next start takes for a cluster: that start
// creates one and its server runs. initdb writes PG_VERSION first and
// global/pg_control last; here a stand-in initdb stops for good between
// the two.
func TestInitdbCutShortIsMadeAgain(t *testing.T) {
	ctx, opts := newCluster(t)
	bin, err := pgcluster.Binaries()
	if err != nil {
		t.Skip(err)
	}
	// Reachable by the server's account when the test runs as root.
	fake, err := os.MkdirTemp("", "cm-initdb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(fake) })
	if err := os.Chmod(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n" +
		"while [ $# -gt 0 ]; do [ \"$1\" = -D ] && d=$2; shift; done\n" +
		"mkdir -p \"$d/global\" && echo 15 > \"$d/PG_VERSION\"\n" +
		"kill -9 $$\n"
	if err := os.WriteFile(filepath.Join(fake, "initdb"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(bin, "postgres"), filepath.Join(fake, "postgres")); err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("PATH")
	t.Setenv("PATH", fake+string(os.PathListSeparator)+path)
	if c, err := pgcluster.Start(ctx, opts); err == nil {
		c.Stop()
		t.Fatal("a killed initdb gave a cluster")
	}
	t.Setenv("PATH", path)
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("the start after an initdb cut short: %v", err)
	}
	defer c.Stop()
	exec(t, ctx, c.URL(), "CREATE TABLE t (v int)")
}
