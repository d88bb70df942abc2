package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// waitFor is the bound on anything a test waits for. It is a failure
// bound, never a performance assertion.
const waitFor = 10 * time.Second

// checkFor polls fn until it returns nil or waitFor passes.
func checkFor(t testing.TB, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %v", waitFor, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// socketPath returns a short socket path (sun_path is 108 bytes) removed
// at cleanup.
func socketPath(t testing.TB) string {
	dir, err := os.MkdirTemp("", "jrpc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

// testServer is a real Server on a real Unix socket.
type testServer struct {
	*Server
	path string
	logs *observer.ObservedLogs
	// disconnects receives Run's result for every connection.
	disconnects chan error
	// wrap, when set, wraps every accepted net.Conn (before the Server
	// sees it).
	served chan struct{}
}

// startServer serves srv on a fresh Unix socket until the test ends.
// wrap, if not nil, wraps each accepted connection.
func startServer(t testing.TB, srv *Server, wrap func(net.Conn) net.Conn) *testServer {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	if srv.Options.Logger == nil {
		srv.Options.Logger = zap.New(core)
	}
	ts := &testServer{Server: srv, path: socketPath(t), logs: logs,
		disconnects: make(chan error, 1024), served: make(chan struct{})}
	prev := srv.OnDisconnect
	srv.OnDisconnect = func(c *Conn, p Peer, err error) {
		if prev != nil {
			prev(c, p, err)
		}
		ts.disconnects <- err
	}
	ln, err := net.Listen("unix", ts.path)
	if err != nil {
		t.Fatal(err)
	}
	var l net.Listener = ln
	if wrap != nil {
		l = wrapListener{ln, wrap}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(ts.served)
		if err := srv.Serve(ctx, l); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		testwait.Recv(t, ts.served)
	})
	return ts
}

type wrapListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l wrapListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.wrap(nc), nil
}

// countingConn counts the bytes the server has read.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// client is a raw NDJSON client.
type client struct {
	t  testing.TB
	nc *net.UnixConn
	r  *bufio.Reader
}

func dial(t testing.TB, path string) *client {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &client{t: t, nc: nc.(*net.UnixConn), r: bufio.NewReaderSize(nc, 1<<16)}
}

func (c *client) send(lines ...string) {
	c.t.Helper()
	for _, l := range lines {
		if _, err := io.WriteString(c.nc, l+"\n"); err != nil {
			c.t.Fatalf("send: %v", err)
		}
	}
}

func dialErr(path string) (net.Conn, error) {
	nc, err := net.Dial("unix", path)
	if err == nil {
		nc.Close()
	}
	return nc, err
}

// recv reads one line (without its LF).
func (c *client) recv() string {
	c.t.Helper()
	line, err := c.recvErr()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	return line
}

func (c *client) recvErr() (string, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(waitFor))
	line, err := c.r.ReadString('\n')
	if err != nil {
		return line, err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// recvMsg reads and decodes one line.
func (c *client) recvMsg() wireMsg {
	c.t.Helper()
	line := c.recv()
	var m wireMsg
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		c.t.Fatalf("reply %q: %v", line, err)
	}
	m.line = line
	return m
}

// expectEOF asserts the server closes the connection with nothing more
// sent (a reset after the server closed with unread input counts too).
func (c *client) expectEOF() {
	c.t.Helper()
	line, err := c.recvErr()
	if err == nil || line != "" {
		c.t.Fatalf("got %q, %v; want end of stream", line, err)
	}
	if !errors.Is(err, io.EOF) && !isReset(err) {
		c.t.Fatalf("got %v; want end of stream", err)
	}
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe"))
}

// wireMsg is a decoded frame, for assertions.
type wireMsg struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   *Error          `json:"error"`
	line    string
}

func (m wireMsg) String() string { return m.line }

// testHandler serves the methods the tests use.
type testHandler struct {
	mu     sync.Mutex
	notes  []string // methods of notifications handled
	onCall func(ctx context.Context, c *Conn, req *Request) (any, error)
}

func (h *testHandler) Handle(ctx context.Context, c *Conn, req *Request) (any, error) {
	if req.ID == nil {
		h.mu.Lock()
		h.notes = append(h.notes, req.Method)
		h.mu.Unlock()
	}
	switch req.Method {
	case "echo":
		return req.Params, nil
	case "initialize":
		c.MarkInitialized()
		return map[string]int{"protocol_version": 1}, nil
	case "null":
		return nil, nil
	case "fail":
		return nil, fmt.Errorf("looking up: %w", NewError(CodeSessionNotFound, "Session not found", map[string]string{"reason": "not_found"}))
	case "boom":
		return nil, errors.New("database exploded with secret details")
	case "panic":
		panic("handler bug")
	}
	if h.onCall != nil {
		return h.onCall(ctx, c, req)
	}
	return nil, MethodNotFound(req.Method)
}

func (h *testHandler) notifications() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.notes...)
}

// errData decodes an error's data.
func errData(t testing.TB, e *Error) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(e.Data, &m); err != nil {
		t.Fatalf("error data %q: %v", e.Data, err)
	}
	return m
}
