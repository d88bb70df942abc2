// Package testenv starts the real servers tests run against: a throwaway
// PostgreSQL cluster (or DATABASE_URL when set) and in-process nats-servers
// on random ports. Nothing is mocked.
//
// A package that uses Postgres must run its tests through Main, which stops
// the shared cluster when the tests end:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/clawmesh/clawmesh/internal/pgcluster"
)

var shared struct {
	once     sync.Once
	cluster  *pgcluster.Cluster
	dir      string
	adminURL string
	err      error
}

// sharedConnections is the connection limit of a test server: every
// test of a package shares it, each with pools of its own.
const sharedConnections = 300

// Main runs the package's tests and then stops the shared cluster.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the shared cluster, if one was started, and removes it; for
// a TestMain that cannot use Main. On an external server (DATABASE_URL)
// it drops the template databases PostgresPrepared made.
func Stop() {
	if shared.cluster == nil && shared.adminURL != "" {
		dropTemplates(shared.adminURL)
	}
	if shared.cluster != nil {
		shared.cluster.Stop()
		os.RemoveAll(shared.dir)
		shared.cluster = nil
	}
}

func adminURL() (string, error) {
	shared.once.Do(func() {
		if u := os.Getenv("DATABASE_URL"); u != "" {
			shared.adminURL = u
			return
		}
		dir, err := os.MkdirTemp("", "clawmesh-pgtest-")
		if err != nil {
			shared.err = err
			return
		}
		shared.dir = dir
		c, err := pgcluster.Start(context.Background(), pgcluster.Options{Dir: dir, Fast: true, MaxConnections: sharedConnections})
		if err != nil {
			shared.err = err
			os.RemoveAll(dir)
			return
		}
		shared.cluster = c
		// Not AdminURL: template1 is what CREATE DATABASE copies, and it
		// refuses to while another test is connected to it.
		shared.adminURL = c.URL()
	})
	return shared.adminURL, shared.err
}

// Postgres returns the URL of a new, empty database that is dropped when
// the test ends.
func Postgres(t testing.TB) string {
	t.Helper()
	admin, err := adminURL()
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	return newDatabase(t, admin, "")
}

// newDatabase creates a database of the test's own on the server at
// admin, with CREATE DATABASE's options given (a TEMPLATE), dropped when
// the test ends, and returns its URL.
func newDatabase(t testing.TB, admin, options string) string {
	t.Helper()
	name := "t_" + randomHex(8)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect postgres: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" "+options); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("parse database url: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// NATSMaxPayload is the test server's message bound: bus.MaxPayload, the
// stack's (bus cannot be imported here, its tests import this package;
// TestTestServersTakeTheStacksBound in bus holds the two equal).
const NATSMaxPayload = 8 << 20

// NATS starts an in-process nats-server on a random loopback port for this
// test and returns its URL; it is shut down when the test ends.
func NATS(t testing.TB) string {
	t.Helper()
	return StartNATS(t).URL()
}

// NATSServer is an in-process nats-server of one test's, which the test
// may reach into (to disconnect a client) or restart.
type NATSServer struct {
	t    testing.TB
	port int

	mu  sync.Mutex
	srv *server.Server
}

// StartNATS starts an in-process nats-server on a random loopback port
// for this test; it is shut down when the test ends.
func StartNATS(t testing.TB) *NATSServer {
	t.Helper()
	s := &NATSServer{t: t, port: server.RANDOM_PORT}
	t.Cleanup(s.Shutdown)
	s.start()
	return s
}

func (s *NATSServer) start() {
	s.t.Helper()
	// The stack's message bound, not the server's default of 1 MB: a test
	// sees what the stack does with a large update.
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: s.port, NoLog: true, NoSigs: true, MaxPayload: NATSMaxPayload})
	if err != nil {
		s.t.Fatalf("nats-server: %v", err)
	}
	srv.Start() // returns once it listens: see natsembed.Run
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		s.t.Fatalf("nats-server not ready")
	}
	s.mu.Lock()
	s.srv = srv
	s.port = srv.Addr().(*net.TCPAddr).Port // the same one across a restart
	s.mu.Unlock()
}

// URL is the server's client URL; it stays the same across a restart.
func (s *NATSServer) URL() string {
	return fmt.Sprintf("nats://127.0.0.1:%d", s.port)
}

// Server is the running server (nil while it is shut down).
func (s *NATSServer) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Shutdown shuts the server down and waits for it; its clients see it
// gone. Safe to call twice.
func (s *NATSServer) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Start starts the server again, on the same port, after Shutdown; it
// returns once it accepts connections.
func (s *NATSServer) Start() {
	s.t.Helper()
	if s.Server() != nil {
		return
	}
	s.start()
}

// Logger logs through the test's output.
func Logger(t testing.TB) *zap.Logger { return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)) }

// Eventually polls fn every interval until it returns nil or wait passes,
// then fails the test with fn's last error.
func Eventually(t testing.TB, wait, interval time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", wait, err)
		}
		time.Sleep(interval)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("random: %v", err))
	}
	return hex.EncodeToString(b)
}

// PGServer is a PostgreSQL cluster of one test's own, which the test may
// stop and start again to see what happens while the database is down.
// Its data survives a stop; it is removed when the test ends.
type PGServer struct {
	t   testing.TB
	dir string
	url string

	mu sync.Mutex
	c  *pgcluster.Cluster
}

// PrivatePostgres starts a cluster for this test alone (DATABASE_URL is
// not used: that server is not the test's to stop).
func PrivatePostgres(t testing.TB) *PGServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "clawmesh-pgown-")
	if err != nil {
		t.Fatal(err)
	}
	p := &PGServer{t: t, dir: dir}
	t.Cleanup(func() {
		p.Stop()
		os.RemoveAll(dir)
	})
	p.Start()
	return p
}

// URL is the connection string of the cluster's clawmesh database; it
// stays the same across a stop and a start.
func (p *PGServer) URL() string { return p.url }

// Stop shuts the server down (a fast shutdown: open connections are
// cut) and waits for it to exit.
func (p *PGServer) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil {
		p.c.Stop()
		p.c = nil
	}
}

// Start starts the server again on the same data; it returns once it
// accepts connections.
func (p *PGServer) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil {
		return
	}
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{Dir: p.dir, Fast: true, MaxConnections: sharedConnections})
	if err != nil {
		p.t.Fatalf("start postgres: %v", err)
	}
	p.c, p.url = c, c.URL()
}

// PGTool runs one of PostgreSQL's client tools (pg_dump, pg_restore) of
// the test server's version: from the folder initdb really lives in (the
// one on PATH may be a link alone). It skips the test without them.
func PGTool(t testing.TB, name string, args ...string) {
	t.Helper()
	dir, err := pgcluster.Binaries()
	if err != nil {
		t.Skip(err)
	}
	initdb, err := filepath.EvalSymlinks(filepath.Join(dir, "initdb"))
	if err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(filepath.Dir(initdb), name)
	if _, err := os.Stat(tool); err != nil {
		t.Skipf("%s not beside the server binaries: %v", name, err)
	}
	if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}
