package pg_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

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

// A start on a schema whose migrations are all applied reads that they
// are and takes no lock, so a replica migrating meanwhile (here: the lock
// held elsewhere) does not hold it up; a start with a migration pending
// waits for the lock, and applies it once the lock is free. A migration
// added later is applied at the next start.
func TestMigratedSchemaStartsWithoutTheLock(t *testing.T) {
	url := testenv.Postgres(t)
	log := testenv.Logger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	migs := fstest.MapFS{"0001_init.sql": {Data: []byte("CREATE TABLE items (name text);")}}
	p, err := pg.Open(ctx, url, "delta", migs, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", pg.LockKeyFor("delta")); err != nil {
		t.Fatal(err)
	}

	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	err = pg.Migrate(short, p, "delta", migs, log)
	cancelShort()
	if err != nil {
		t.Fatalf("nothing pending, yet the start waited for the migration lock: %v", err)
	}

	more := fstest.MapFS{
		"0001_init.sql": migs["0001_init.sql"],
		"0002_more.sql": {Data: []byte("INSERT INTO items VALUES ('second');")},
	}
	short, cancelShort = context.WithTimeout(ctx, 300*time.Millisecond)
	err = pg.Migrate(short, p, "delta", more, log)
	cancelShort()
	if err == nil {
		t.Fatal("a pending migration was applied while another held the lock")
	}
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", pg.LockKeyFor("delta")); err != nil {
		t.Fatal(err)
	}
	if err := pg.Migrate(ctx, p, "delta", more, log); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM items WHERE name = 'second'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the migration added later: %d rows (%v), want 1", n, err)
	}
}

// A schema a newer version migrated further is refused by an older one,
// whose own migrations are all applied there: it would write rows the
// way it knew, and the newer version read them wrong. Nothing is
// changed in the schema.
func TestNewerSchemaRefused(t *testing.T) {
	url := testenv.Postgres(t)
	log := testenv.Logger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	older := fstest.MapFS{"0001_init.sql": {Data: []byte("CREATE TABLE items (name text);")}}
	newer := fstest.MapFS{
		"0001_init.sql":  older["0001_init.sql"],
		"0002_count.sql": {Data: []byte("CREATE TABLE item_count (n int);")},
	}
	p, err := pg.Open(ctx, url, "epsilon", newer, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = pg.Open(ctx, url, "epsilon", older, log)
	if !errors.Is(err, pg.ErrNewerSchema) {
		t.Fatalf("an older version on a newer schema: %v, want ErrNewerSchema", err)
	}
	for _, want := range []string{"epsilon", "0002", "0001_init.sql"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %s", err, want)
		}
	}
	// The newer version still runs on it.
	if err := pg.Migrate(ctx, p, "epsilon", newer, log); err != nil {
		t.Fatal(err)
	}
}

func TestIsUnavailable(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"a connection lost earlier in the operation", fmt.Errorf("commit failed: %w", pgconn.ErrConnClosed), true},
		{"a connection lost mid-read", fmt.Errorf("insert: %w", io.ErrUnexpectedEOF), true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"a unique violation", fmt.Errorf("insert: %w", &pgconn.PgError{Code: "23505"}), false},
		{"anything else", errors.New("encode config: bad value"), false},
		{"a connection reset", fmt.Errorf("query: %w", &net.OpError{Op: "read", Net: "unix", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true},
		// A file's error, not the database's: its errno is a net.Error.
		{"a folder removed", fmt.Errorf("open workspace: %w", &fs.PathError{Op: "open", Path: "/data/workspaces", Err: syscall.ENOENT}), false},
		{"a disk read-only", fmt.Errorf("write file: %w", &fs.PathError{Op: "open", Path: "/data/x", Err: syscall.EROFS}), false},
	} {
		if got := pg.IsUnavailable(c.err); got != c.want {
			t.Errorf("%s: IsUnavailable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A statement the server cancels or rolls back is busy, not unavailable:
// the database answered, and health stays as it is.
func TestIsBusy(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET statement_timeout = 10"); err != nil {
		t.Fatal(err)
	}
	_, timedOut := conn.Exec(ctx, "SELECT pg_sleep(1)")
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"a statement_timeout", fmt.Errorf("list sessions: %w", timedOut), true},
		{"a deadlock victim", &pgconn.PgError{Code: "40P01"}, true},
		{"a serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"a lock_timeout", &pgconn.PgError{Code: "55P03"}, true},
		{"a unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"a connection lost", fmt.Errorf("insert: %w", io.ErrUnexpectedEOF), false},
	} {
		if got := pg.IsBusy(c.err); got != c.want {
			t.Errorf("%s: IsBusy(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
		if c.want && pg.IsUnavailable(c.err) {
			t.Errorf("%s: IsUnavailable(%v): the database answered", c.name, c.err)
		}
	}
}

func TestIsDiskFull(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"disk full", fmt.Errorf("append: %w", &pgconn.PgError{Code: "53100"}), true},
		{"out of memory", &pgconn.PgError{Code: "53200"}, false},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, false},
		{"a lost connection", io.ErrUnexpectedEOF, false},
	} {
		if got := pg.IsDiskFull(c.err); got != c.want {
			t.Errorf("%s: IsDiskFull(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A statement cancel that reaches the health ping's backend (the server
// answers 57014, as pg_cancel_backend on every active backend makes it)
// is an answer: Watch reports the database up. It reported it
// unavailable, and the service was NOT_SERVING until the next ping.
func TestWatchTakesACancelledPingForAnAnswer(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var answered atomic.Int32
	pg.SetPingAnswer(t, func() error {
		answered.Add(1)
		return &pgconn.PgError{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request"}
	})
	reports := make(chan error, 16)
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan struct{})
	defer func() { stop(); <-watched }()
	go func() {
		defer close(watched)
		pg.Watch(wctx, pool, func(err error) {
			select {
			case reports <- err:
			default:
			}
		})
	}()
	for range 2 {
		select {
		case err := <-reports:
			if err != nil {
				t.Fatalf("a ping the server cancelled reported %v, want the database up", err)
			}
		case <-ctx.Done():
			t.Fatal("no report from Watch")
		}
	}
	if answered.Load() == 0 {
		t.Fatal("no ping was answered with the cancel")
	}
}

// A start that applies migrations to a schema that had some says so in
// one pg.Upgraded line naming the newest migration before and after, which
// the launcher tells the user (launcher/upgraded.go); a new schema, and a
// start with nothing to apply, write none.
func TestUpgradeIsLoggedOnce(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	first := fstest.MapFS{
		"0001_init.sql": {Data: []byte("CREATE TABLE items (name text);")},
		"0002_more.sql": {Data: []byte("ALTER TABLE items ADD COLUMN n integer;")},
	}
	p, err := pg.Open(ctx, url, "upgraded", first, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := logs.FilterMessage(pg.Upgraded).Len(); got != 0 {
		t.Fatalf("a new schema logged %d upgrade lines", got)
	}
	if err := pg.Migrate(ctx, p, "upgraded", first, log); err != nil {
		t.Fatal(err)
	}
	if got := logs.FilterMessage(pg.Upgraded).Len(); got != 0 {
		t.Fatalf("a start with nothing to apply logged %d upgrade lines", got)
	}
	next := fstest.MapFS{
		"0001_init.sql":   first["0001_init.sql"],
		"0002_more.sql":   first["0002_more.sql"],
		"0003_third.sql":  {Data: []byte("ALTER TABLE items ADD COLUMN m integer;")},
		"0004_fourth.sql": {Data: []byte("ALTER TABLE items ADD COLUMN o integer;")},
	}
	if err := pg.Migrate(ctx, p, "upgraded", next, log); err != nil {
		t.Fatal(err)
	}
	ups := logs.FilterMessage(pg.Upgraded).All()
	if len(ups) != 1 {
		t.Fatalf("an upgrade logged %d upgrade lines, want 1", len(ups))
	}
	f := ups[0].ContextMap()
	if f["schema"] != "upgraded" || f["from"] != "0002_more.sql" || f["to"] != "0004_fourth.sql" {
		t.Errorf("upgrade line %v, want schema upgraded from 0002_more.sql to 0004_fourth.sql", f)
	}
}
