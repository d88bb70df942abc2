package pg_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestMigrationsApplyOnceInOrderPerSchema(t *testing.T) {
	url := testenv.Postgres(t)
	log := testenv.Logger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	migs := fstest.MapFS{
		"0002_add.sql":  {Data: []byte("INSERT INTO items (name) VALUES ('second');")},
		"0001_init.sql": {Data: []byte("CREATE TABLE items (name text); INSERT INTO items VALUES ('first');")},
	}
	a, err := pg.Open(ctx, url, "alpha", migs, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Applying again (a restart, or a second replica) changes nothing.
	if err := pg.Migrate(ctx, a, "alpha", migs, log); err != nil {
		t.Fatal(err)
	}
	var names []string
	rows, err := a.Query(ctx, "SELECT name FROM items ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		names = append(names, n)
	}
	if len(names) != 2 || names[0] != "first" || names[1] != "second" {
		t.Fatalf("items %v: each migration must run exactly once, in version order", names)
	}

	// Another service's schema does not see alpha's tables unqualified.
	b, err := pg.Open(ctx, url, "beta", nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Exec(ctx, "SELECT 1 FROM items"); err == nil {
		t.Fatal("schema beta reads alpha's table through its search_path")
	}
}

func TestMigrationFailureRollsBack(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad := fstest.MapFS{"0001_bad.sql": {Data: []byte("CREATE TABLE half (x int); SELECT no_such_function();")}}
	if _, err := pg.Open(ctx, url, "gamma", bad, testenv.Logger(t)); err == nil {
		t.Fatal("a failing migration was accepted")
	}
	good := fstest.MapFS{"0001_bad.sql": {Data: []byte("CREATE TABLE half (x int);")}}
	p, err := pg.Open(ctx, url, "gamma", good, testenv.Logger(t))
	if err != nil {
		t.Fatalf("the failed migration left something behind: %v", err)
	}
	p.Close()
}

func TestRejectsBadNames(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pg.Open(ctx, url, "Bad-Name", nil, testenv.Logger(t)); err == nil {
		t.Fatal("schema name with a dash accepted")
	}
	if _, err := pg.Open(ctx, url, "delta", fstest.MapFS{"init.sql": {Data: []byte("SELECT 1")}}, testenv.Logger(t)); err == nil {
		t.Fatal("migration without a version accepted")
	}
}
