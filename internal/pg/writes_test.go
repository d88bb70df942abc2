package pg

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The write count of a pool made by Open rises after every statement that
// may have written, a transaction's after its COMMIT, and never for a
// SELECT; a pool made elsewhere has none.
func TestWritesCounted(t *testing.T) {
	ctx, url, pool := itemsPool(t, "writes")
	w := WritesOf(pool)
	if w == nil {
		t.Fatal("no write count on a pool made by Open")
	}

	rose := func(what string, fn func() error, want bool) {
		t.Helper()
		before := w.Load()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := w.Load() != before; got != want {
			t.Fatalf("%s: count rose %v, want %v", what, got, want)
		}
	}
	exec := func(sql string) func() error {
		return func() error { _, err := pool.Exec(ctx, sql); return err }
	}
	var n int
	count := func() error { return pool.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n) }

	rose("a SELECT", count, false)
	rose("an INSERT", exec("INSERT INTO items VALUES ('a')"), true)
	rose("an UPDATE", exec("UPDATE items SET name = 'b' WHERE name = 'a'"), true)
	rose("an UPDATE ... RETURNING", func() error {
		var s string
		return pool.QueryRow(ctx, "UPDATE items SET name = 'c' WHERE name = 'b' RETURNING name").Scan(&s)
	}, true)
	rose("a DELETE", exec("DELETE FROM items WHERE name = 'c'"), true)
	rose("a failed statement", func() error {
		if _, err := pool.Exec(ctx, "INSERT INTO nowhere VALUES (1)"); err == nil {
			t.Fatal("an insert into a missing table succeeded")
		}
		return nil
	}, true)

	// In a transaction, the count rises again once the COMMIT has
	// returned: a reader that loaded it between the INSERT and the COMMIT
	// sees it change after the COMMIT.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO items VALUES ('d')"); err != nil {
		t.Fatal(err)
	}
	rose("a COMMIT", func() error { return tx.Commit(ctx) }, true)
	rose("a batch", func() error {
		b := &pgx.Batch{}
		b.Queue("INSERT INTO items VALUES ('e')")
		return pool.SendBatch(ctx, b).Close()
	}, true)
	rose("a COPY", func() error {
		_, err := pool.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"name"}, pgx.CopyFromRows([][]any{{"f"}}))
		return err
	}, true)
	if rose("a SELECT", count, false); n != 3 {
		t.Fatalf("%d rows", n)
	}

	other, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if WritesOf(other) != nil {
		t.Fatal("a write count on a pool Open did not make")
	}
}

// itemsPool opens a pool by Open on a fresh database with a table items
// (name text), closed when the test ends; it returns the test's context
// and the database's url.
func itemsPool(t *testing.T, schema string) (context.Context, string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	pool, err := Open(ctx, url, schema, fstest.MapFS{
		"0001_init.sql": {Data: []byte("CREATE TABLE items (name text PRIMARY KEY);")},
	}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return ctx, url, pool
}

// A write that failed on the client's side with its connection closed
// leaves its backend unsure: Settled says no while the backend lives
// (even idle: it may not have read the statement yet), and yes, with the
// count raised, once it is gone. A write the server refused, one that
// failed with its connection kept (nothing sent), or a read cancelled
// before it was sent, leaves nothing unsure.
func TestUnsureWritesSettle(t *testing.T) {
	ctx, url, pool := itemsPool(t, "unsure")
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
	_, err := pool.Exec(short, "INSERT INTO items SELECT 'slow' FROM pg_sleep(3)")
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
	// read. It lasts past a few settleEvery: the last question, made
	// while settling above, may be less than one old when it begins.
	asked, start, reads := w.questions.Load(), time.Now(), 0
	for ; reads < 2000 || time.Since(start) < 3*settleEvery; reads++ {
		if w.Settled(ctx, pool) {
			t.Fatal("settled while the failed write's backend lives")
		}
	}
	if n, most := w.questions.Load()-asked, 2+int64(time.Since(start)/settleEvery); n < 1 || n > most {
		t.Fatalf("%d questions to the server for %d reads, want 1 to %d", n, reads, most)
	}
	live.Close(ctx)
	settle("the backend closed")
}
