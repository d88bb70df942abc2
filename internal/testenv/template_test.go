package testenv

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// Each test's prepared database is a copy of one prepared once: what
// prepare made is in every copy, prepare ran once for all of them, and a
// copy is the test's alone (a write to one is not in another, nor in
// the next copy made).
func TestPreparedDatabasesAreCopiesOfOnePrepare(t *testing.T) {
	var runs atomic.Int32
	prepare := func(ctx context.Context, url string) error {
		runs.Add(1)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "CREATE SCHEMA s; CREATE TABLE s.t (v text); INSERT INTO s.t VALUES ('prepared')")
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows := func(url string) []string {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		r, err := conn.Query(ctx, "SELECT v FROM s.t ORDER BY v")
		if err != nil {
			t.Fatal(err)
		}
		vs, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	a := PostgresPrepared(t, "testenv_copies", prepare)
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO s.t VALUES ('written to a')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	b := PostgresPrepared(t, "testenv_copies", prepare)
	if a == b {
		t.Fatalf("two tests' databases share the URL %s", a)
	}
	if got := rows(a); len(got) != 2 {
		t.Fatalf("the first copy holds %q, want what was prepared and what was written to it", got)
	}
	if got := rows(b); len(got) != 1 || got[0] != "prepared" {
		t.Fatalf("the second copy holds %q, want what was prepared alone", got)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("prepare ran %d times for two databases, want once", n)
	}
}
