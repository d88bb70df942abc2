package testenv

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Most tests of a service open their database through the service's
// own pg.Open, which applies every migration of its schema to the new,
// empty database: the same DDL, test after test. PostgresPrepared does
// it once a process, on a database of its own, and gives each test a
// copy of it (CREATE DATABASE ... TEMPLATE): the test's pg.Open then
// finds every migration applied, as on any start after a service's
// first. A test of the migrations themselves uses Postgres.

var templates struct {
	mu    sync.Mutex
	byKey map[string]*template
}

type template struct {
	once sync.Once
	name string
	err  error
}

var templateKey = regexp.MustCompile(`^[a-z0-9_]{1,40}$`)

// PostgresPrepared returns the URL of a new database of the test's own
// (dropped when the test ends), a copy of the one prepare was run on
// once this process for key (a plain lower-case name: the schema it
// prepares, say). prepare gets that database's URL and must close every
// connection it opened before it returns: a database is copied only
// while no one is connected to it. The copy holds what prepare left:
// its schemas, tables and rows, and nothing of the session (settings,
// sequences' caches aside).
func PostgresPrepared(t testing.TB, key string, prepare func(ctx context.Context, url string) error) string {
	t.Helper()
	if !templateKey.MatchString(key) {
		t.Fatalf("template key %q: want 1 to 40 of [a-z0-9_]", key)
	}
	admin, err := adminURL()
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	templates.mu.Lock()
	if templates.byKey == nil {
		templates.byKey = map[string]*template{}
	}
	tpl, ok := templates.byKey[key]
	if !ok {
		tpl = &template{name: "tpl_" + key + "_" + randomHex(4)}
		templates.byKey[key] = tpl
	}
	templates.mu.Unlock()
	tpl.once.Do(func() { tpl.err = makeTemplate(admin, tpl.name, prepare) })
	if tpl.err != nil {
		t.Fatalf("template database %s: %v", key, tpl.err)
	}
	return newDatabase(t, admin, "TEMPLATE "+tpl.name)
}

// makeTemplate creates the database name, runs prepare on it and then
// closes it to connections, so that no one (a test given the wrong URL)
// holds it when it is copied.
func makeTemplate(admin, name string, prepare func(ctx context.Context, url string) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	u, err := url.Parse(admin)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	u.Path = "/" + name
	if err := prepare(ctx, u.String()); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+name+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("close to connections: %w", err)
	}
	return nil
}

// dropTemplates drops the template databases made on an external
// server (DATABASE_URL); a cluster of the process's own goes whole.
func dropTemplates(admin string) {
	templates.mu.Lock()
	defer templates.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conn *pgx.Conn
	for _, tpl := range templates.byKey {
		if tpl.err != nil {
			continue
		}
		if conn == nil {
			var err error
			if conn, err = pgx.Connect(ctx, admin); err != nil {
				return
			}
			defer conn.Close(context.Background())
		}
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+tpl.name+" WITH (FORCE)")
	}
	templates.byKey = nil
}
