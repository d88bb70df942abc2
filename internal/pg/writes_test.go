package pg_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The write count of a pool made by Open rises after every statement that
// may have written, a transaction's after its COMMIT, and never for a
// SELECT; a pool made elsewhere has none.
func TestWritesCounted(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pg.Open(ctx, url, "writes", fstest.MapFS{
		"0001_init.sql": {Data: []byte("CREATE TABLE items (name text PRIMARY KEY);")},
	}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w := pg.WritesOf(pool)
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
	if pg.WritesOf(other) != nil {
		t.Fatal("a write count on a pool Open did not make")
	}
}
