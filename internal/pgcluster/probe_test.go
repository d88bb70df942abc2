package pgcluster

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// A probe reads the postmaster's lock file first: while the server says
// it is starting, the probe makes no connection (each one would fork a
// backend only to refuse it); once it says anything else, or nothing,
// the connection decides (a server shutting down answers with its
// refusal). A stand-in listens on the server's
// socket and counts the connections it is offered.
func TestProbeWaitsForTheLockFilesReady(t *testing.T) {
	dir, err := os.MkdirTemp("", "pgprobe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var offered atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			offered.Add(1)
			c.Close() // no server behind it: the probe's connection fails
		}
	}()
	p := &Prepared{dir: dir}
	pidFile := filepath.Join(dir, "data", "postmaster.pid")
	// The lines PostgreSQL 15 writes: pid, data dir, start time, port,
	// socket dir, listen address, shared memory key, then its status.
	head := "4242\n" + filepath.Join(dir, "data") + "\n1796300419\n5432\n" + dir + "\n\n  9961478   5636155\n"
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(pidFile, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	write(head + "starting\n")
	if answered, err := p.Probe(ctx); !errors.Is(err, ErrNotReady) || answered {
		t.Fatalf("lock file says starting: Probe = %v, %v; want not answered and ErrNotReady", answered, err)
	}
	if n := offered.Load(); n != 0 {
		t.Fatalf("%d connections while the lock file said the server was starting", n)
	}
	// "ready" (stale here: nothing serves behind the socket), "stopping",
	// a file without its status line yet, and no file: the connection
	// decides.
	cases := []struct {
		name string
		set  func()
	}{
		{"ready", func() { write(head + "ready   \n") }},
		{"stopping", func() { write(head + "stopping\n") }},
		{"no status line", func() { write(head) }},
		{"no lock file", func() { _ = os.Remove(pidFile) }},
	}
	for i, c := range cases {
		c.set()
		if _, err := p.Probe(ctx); err == nil || errors.Is(err, ErrNotReady) {
			t.Fatalf("%s: Probe error %v; want the failed connection's", c.name, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for offered.Load() < int64(i+1) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := offered.Load(); n != int64(i+1) {
			t.Fatalf("%s: %d connections offered in all, want %d", c.name, n, i+1)
		}
	}
}
