package durablebridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/clawmesh/clawmesh/internal/procstat"
)

// ErrListenURL is a token transport address that breaks the rules.
var ErrListenURL = errors.New("durable.listen_url")

// tokenConns bounds the token transport's open connections; past it a
// connection waits in the kernel's backlog until one closes. The address
// faces the network, where anyone may connect before any token is read:
// without a bound each connection held a goroutine and a TLS handshake's
// memory for up to the 5 s header timeout, as many as a peer could open.
// Collie holds one or two; a variable so that a test may lower it.
var tokenConns = 256

// socketConns bounds the private socket's open connections; past it a
// connection waits in the kernel's backlog until one closes. Any process
// of the user may connect, the stack's descendants too (a tool the model
// runs), refused or not: without a bound each connection held a goroutine
// and its buffers, an events response's 8 MiB for a reader that does not
// read, as many as were opened. A variable so that a test may lower it.
var socketConns = 256

// boundConns bounds ln's open connections to n (both transports), as
// x/net's netutil.LimitListener does, but its connections keep their
// syscall.Conn: a socket caller's pid is read through it (peerPID).
func boundConns(ln net.Listener, n int) net.Listener {
	return &boundListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

type boundListener struct {
	net.Listener
	slots     chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func (l *boundListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &boundConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *boundListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type boundConn struct {
	net.Conn
	release   func()
	closeOnce sync.Once
}

func (c *boundConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(c.release)
	return err
}

// SyscallConn is the underlying connection's.
func (c *boundConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// listenToken listens on the token transport's address: https:// with a
// certificate, or plain http:// on loopback for a local test. It returns
// the URL's path, which prefixes /session/v1.
func listenToken(raw, certFile, keyFile string) (net.Listener, string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrListenURL, raw, fmt.Sprintf(format, args...))
	}
	if len(raw) > 2048 {
		return nil, "", bad("longer than 2048 bytes")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", bad("%v", err)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil, "", bad("no user, query or fragment allowed")
	}
	prefix := strings.TrimSuffix(u.EscapedPath(), "/")
	host := u.Hostname()
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			return nil, "", bad("a local http address names its port")
		}
	}
	addr := net.JoinHostPort(host, port)
	switch u.Scheme {
	case "https":
		if certFile == "" || keyFile == "" {
			return nil, "", bad("https needs durable.tls_cert_file and durable.tls_key_file")
		}
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, "", bad("TLS key pair: %v", err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, "", bad("%v", err)
		}
		ln = boundConns(ln, tokenConns)
		return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), prefix, nil
	case "http":
		if host != "127.0.0.1" && host != "localhost" {
			return nil, "", bad("plain http is allowed on 127.0.0.1 or localhost only")
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			return nil, "", bad("%v", err)
		}
		return boundConns(ln, tokenConns), prefix, nil
	}
	return nil, "", bad("the scheme must be https (or http on loopback)")
}

// peerKey carries a socket caller's pid in a request's context.
type peerKey struct{}

// httpServer builds the server of one transport. Its limits cover a
// starter (Collie waits 30 s for one).
func (b *Bridge) httpServer(tr transport, prefix string) *http.Server {
	srv := &http.Server{
		Handler:           &handler{b: b, tr: tr, prefix: prefix},
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      40 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    16 << 10,
		// "OPTIONS *" is no route of the wire: 404 not-found from the
		// handler, not net/http's empty 200 (and not before the token).
		DisableGeneralOptionsHandler: true,
	}
	if tr == overSocket {
		srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			if pid, ok := peerPID(c); ok {
				return context.WithValue(ctx, peerKey{}, pid)
			}
			return ctx
		}
	}
	return srv
}

// peerPID reads a Unix socket peer's pid (SO_PEERCRED).
func peerPID(c net.Conn) (int, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return 0, false
	}
	return int(cred.Pid), true
}

// launcherPID is the process whose descendants count as the agent's own:
// the launcher that started the bridge, or the bridge itself when it
// runs on its own.
func launcherPID() int {
	if pp := os.Getppid(); pp > 1 {
		return pp
	}
	return os.Getpid()
}

// descendsFrom reports whether pid is root or one of its descendants, by
// walking parent pids in /proc (bounded).
func descendsFrom(pid, root int) bool {
	for range 256 {
		if pid == root {
			return true
		}
		if pid <= 1 {
			return false
		}
		st, err := procstat.Read(pid)
		if err != nil {
			return false
		}
		pid = st.PPID
	}
	return false
}
