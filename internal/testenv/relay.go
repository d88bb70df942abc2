package testenv

import (
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
)

// A RelayHook sees each chunk a relayed connection carries, before it is
// forwarded, toTarget telling its direction; it may sleep to delay it, and
// returns false to stop relaying that direction for good, both ends left
// open (a peer that hangs). A hook serves one connection, called from the
// goroutines of both its directions at once.
type RelayHook func(toTarget bool, chunk []byte) bool

// Relay forwards Unix stream connections accepted on Path to target, for
// tests that put a fault between a client and its server. Its goroutines
// are waited for when the test ends.
type Relay struct {
	Path string

	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool // Close has run: a connection accepted since is closed at once
}

// StartRelay listens on path and relays each connection to target;
// newHook, when not nil, gives each connection its hook.
func StartRelay(t testing.TB, path, target string, newHook func() RelayHook) *Relay {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Path: path, ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", target)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			if r.closed {
				// Accepted just before Close shut the listener: nobody
				// would close it later.
				r.mu.Unlock()
				c.Close()
				s.Close()
				return
			}
			r.conns = append(r.conns, c, s)
			r.mu.Unlock()
			hook := RelayHook(func(bool, []byte) bool { return true })
			if newHook != nil {
				hook = newHook()
			}
			r.wg.Add(2)
			go func() { defer r.wg.Done(); relay(s, c, true, hook) }()
			go func() { defer r.wg.Done(); relay(c, s, false, hook) }()
		}
	}()
	t.Cleanup(r.Close)
	return r
}

// Close stops accepting, closes every relayed connection and waits for
// the relay's goroutines.
func (r *Relay) Close() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// relay copies src to dst through hook; src's end closes dst.
func relay(dst, src net.Conn, toTarget bool, hook RelayHook) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !hook(toTarget, buf[:n]) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				dst.Close()
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// PostgresRelayed names the sockets a relay in front of a PostgreSQL
// server uses: Path, in a folder of the test's, is where the relay
// listens; Target is the server's own socket; URL is dbURL through Path.
type PostgresRelayed struct{ URL, Path, Target string }

// RelayPostgres describes a relay in front of the server of dbURL (a Unix
// socket URL, as Postgres returns); the caller starts it with StartRelay
// on Path and Target.
func RelayPostgres(t testing.TB, dbURL string) PostgresRelayed {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	socket := ".s.PGSQL." + q.Get("port")
	dir := t.TempDir()
	r := PostgresRelayed{Path: filepath.Join(dir, socket), Target: filepath.Join(q.Get("host"), socket)}
	q.Set("host", dir)
	u.RawQuery = q.Encode()
	r.URL = u.String()
	return r
}
