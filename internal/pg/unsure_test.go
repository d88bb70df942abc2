package pg

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A write that failed on the client's side with its connection closed
// leaves its backend unsure: Settled says no while the backend lives
// (even idle: it may not have read the statement yet), and yes, with the
// count raised, once it is gone. A write the server refused, one that
// failed with its connection kept (nothing sent), or a read that failed,
// leaves nothing unsure.
func TestUnsureWritesSettle(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := Open(ctx, url, "unsure", fstest.MapFS{
		"0001_init.sql": {Data: []byte("CREATE TABLE items (name text PRIMARY KEY);")},
	}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w := WritesOf(pool)
	settle := func(what string) {
		t.Helper()
		raised := w.Load()
		deadline := time.Now().Add(20 * time.Second)
		for !w.Settled(ctx, pool) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not settled", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if w.Load() == raised {
			t.Fatalf("%s: settling did not raise the count: what was read meanwhile would be kept", what)
		}
		if w.nUnsure.Load() != 0 {
			t.Fatalf("%s: unsure backends left", what)
		}
	}

	known := func(what string, fn func() error) {
		t.Helper()
		before := w.Load()
		if err := fn(); err == nil {
			t.Fatalf("%s succeeded", what)
		}
		if w.Load() == before {
			t.Fatalf("%s: the count did not rise", what)
		}
		if w.nUnsure.Load() != 0 || !w.Settled(ctx, pool) {
			t.Fatalf("%s left its backend unsure", what)
		}
	}
	known("a write the server refused", func() error {
		_, err := pool.Exec(ctx, "INSERT INTO nowhere VALUES (1)")
		return err
	})
	known("a write that could not be encoded (nothing sent)", func() error {
		_, err := pool.Exec(ctx, "INSERT INTO items VALUES ($1)", make(chan int))
		return err
	})
	readCtx, readCancel := context.WithCancel(ctx)
	readCancel()
	if _, err := pool.Query(readCtx, "SELECT 1"); err == nil {
		t.Fatal("a query on a cancelled context ran")
	}
	if w.nUnsure.Load() != 0 {
		t.Fatal("a failed read left its backend unsure")
	}

	// A write cut by its deadline while the server runs it: pgx closes
	// the connection; the backend is unsure until it has exited.
	short, shortCancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = pool.Exec(short, "INSERT INTO items SELECT 'slow' FROM pg_sleep(3)")
	shortCancel()
	if err == nil {
		t.Fatal("the slow write beat its deadline")
	}
	if w.nUnsure.Load() != 1 {
		t.Fatalf("%d unsure backends after a write cut by its deadline, want 1", w.nUnsure.Load())
	}
	settle("the write cut by its deadline")

	// A backend that lives on, idle, stays unsure.
	live, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	w.Failed(live.PgConn().PID())
	// A flood of reads asks the server once per settleEvery, not once a
	// read.
	asked, start := w.questions.Load(), time.Now()
	for range 2000 {
		if w.Settled(ctx, pool) {
			t.Fatal("settled while the failed write's backend lives")
		}
	}
	if n, most := w.questions.Load()-asked, 2+int64(time.Since(start)/settleEvery); n < 1 || n > most {
		t.Fatalf("%d questions to the server for 2000 reads, want 1 to %d", n, most)
	}
	live.Close(ctx)
	settle("the backend closed")
}
