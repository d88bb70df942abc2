package pg

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A write that failed on the client's side (a deadline) leaves its
// backend unsure: Settled says no while the server still runs a statement
// there, and yes, with the count raised, once the backend is idle. A
// write the server refused, or a read that failed, leaves nothing unsure.
func TestUnsureWritesSettle(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := Open(ctx, url, "unsure", fstest.MapFS{
		"0001_init.sql": {Data: []byte("CREATE TABLE items (name text PRIMARY KEY);")},
	}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w := WritesOf(pool)
	tr := pool.Config().ConnConfig.Tracer.(*writeTracer)

	if _, err := pool.Exec(ctx, "INSERT INTO nowhere VALUES (1)"); err == nil {
		t.Fatal("an insert into a missing table succeeded")
	}
	if !w.Settled(ctx, pool) || w.nUnsure.Load() != 0 {
		t.Fatal("a write the server refused left its backend unsure")
	}
	readCtx, readCancel := context.WithCancel(ctx)
	readCancel()
	if _, err := pool.Query(readCtx, "SELECT 1"); err == nil {
		t.Fatal("a query on a cancelled context ran")
	}
	if w.nUnsure.Load() != 0 {
		t.Fatal("a failed read left its backend unsure")
	}

	// A backend busy with a statement stands for the failed write still
	// running on the server.
	busy, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close(context.Background())
	slept := make(chan error, 1)
	go func() {
		_, err := busy.Exec(ctx, "SELECT pg_sleep(20)")
		slept <- err
	}()
	pid := busy.PgConn().PID()
	for i := 0; ; i++ {
		var state string
		_ = pool.QueryRow(ctx, "SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&state)
		if state == "active" {
			break
		}
		if i > 200 {
			t.Fatalf("backend %d never ran the statement", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := w.Load()
	tr.TraceQueryEnd(ctx, busy, pgx.TraceQueryEndData{Err: context.DeadlineExceeded})
	if w.Load() == before {
		t.Fatal("the count did not rise after a failed write")
	}
	if w.Settled(ctx, pool) {
		t.Fatal("settled while the failed write's backend still runs a statement")
	}
	if _, err := pool.Exec(ctx, "SELECT pg_cancel_backend($1)", int64(pid)); err != nil {
		t.Fatal(err)
	}
	if err := <-slept; err == nil {
		t.Fatal("the sleep was not cancelled")
	}
	raised := w.Load()
	deadline := time.Now().Add(10 * time.Second)
	for !w.Settled(ctx, pool) {
		if time.Now().After(deadline) {
			t.Fatal("not settled once the backend is idle")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w.Load() == raised {
		t.Fatal("settling did not raise the count: what was read meanwhile would be kept")
	}
	if w.nUnsure.Load() != 0 {
		t.Fatal("unsure backends left")
	}
}
