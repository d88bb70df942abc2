package gateway

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// hungSession never answers Status or State until the test ends.
type hungSession struct {
	sessionv1.UnimplementedSessionServiceServer
	release chan struct{}
	calls   chan struct{}
}

// newHungSession is released when the test ends.
func newHungSession(t *testing.T) *hungSession {
	h := &hungSession{release: make(chan struct{}), calls: make(chan struct{}, 16)}
	t.Cleanup(func() { close(h.release) })
	return h
}

func (h *hungSession) Status(ctx context.Context, _ *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	h.calls <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return nil, ctx.Err()
}

func (h *hungSession) ConnectionClosed(context.Context, *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	return &sessionv1.ConnectionClosedResponse{}, nil
}

// runGateway runs a gateway with fake config and session services until
// the test ends.
func runGateway(t *testing.T, session sessionv1.SessionServiceServer, callTimeout time.Duration, set ...func(*Gateway)) (*Gateway, string) {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	log := zap.NewNop()
	socket := filepath.Join(t.TempDir(), "gw.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{
		cfg: Config{Socket: socket, Drain: time.Second, EphemeralGrace: time.Second, Log: log}, log: log,
		limits: configclient.RPCLimits{MaxFrameBytes: 1 << 20, InitializeTimeout: 10 * time.Second, FrameTimeout: 10 * time.Second,
			WriteStallTimeout: 10 * time.Second, MaxConnections: 64, CallTimeout: callTimeout},
		started: time.Now(), nats: nc, hub: newHub(nc, log, nil),
		monitor: newMonitor(time.Hour, log), states: map[*jsonrpc.Conn]*connState{}, ln: ln,
		config:  configv1.NewConfigServiceClient(serveFake(t, func(s *grpc.Server) { configv1.RegisterConfigServiceServer(s, fakeConfig{}) })),
		session: sessionv1.NewSessionServiceClient(serveFake(t, func(s *grpc.Server) { sessionv1.RegisterSessionServiceServer(s, session) })),
	}
	g.initSharedReads()
	for _, f := range set {
		f(g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := testwait.Recv(t, ran); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return g, socket
}

// dialInitialized connects to the gateway's socket and initializes; the
// caller closes the client.
func dialInitialized(t *testing.T, socket string) *rpcclient.Client {
	t.Helper()
	c, err := rpcclient.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// status requests wait for a shared read without a goroutine each; with
// the session service hung:
//   - each status is answered at its own deadline (sessions_unavailable
//     saying the session service timed out), the one sent while the
//     first read was in flight too, not at the end of that read nor of a
//     read after it: the shared read here has a bound of an hour, so a
//     status waiting for any read to end would not be answered within
//     the test;
//   - the connection still serves what it sends next (health) while its
//     statuses wait;
//   - a client that leaves with statuses pending is let go at once: its
//     connection is torn down without waiting for the hung read, which
//     alone still holds its key, and no read is run for the callers that
//     left.
//
// Nothing here is timed against an upper bound: on a loaded machine the
// 300 ms deadline came before the test's health was served, or both
// statuses more than 600 ms after the first was sent (2 of 100 runs at a
// load of 31, docs/testing.md, "Sixty-third round").
func TestSharedReadsOfAHungService(t *testing.T) {
	sess := newHungSession(t)
	const timeout = 300 * time.Millisecond
	_, socket := runGateway(t, sess, timeout, func(g *Gateway) { g.statusReads.Timeout = time.Hour })

	c := dialInitialized(t, socket)
	defer c.Close()
	start := time.Now()
	if err := c.Send(`{"jsonrpc":"2.0","id":1,"method":"status","params":{}}`); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, sess.calls) // the first read is in flight
	second := time.Now()
	if err := c.Send(`{"jsonrpc":"2.0","id":2,"method":"status","params":{}}`); err != nil {
		t.Fatal(err)
	}
	sent := map[string]time.Time{"1": start, "2": second}
	for range 2 {
		f, _, err := c.Read(10 * time.Second)
		if err != nil || f.Error != nil || !strings.Contains(string(f.Result), `"sessions_unavailable":"session timed out"`) {
			t.Fatalf("status: %+v, %v; want the hung service's time-out in sessions_unavailable", f, err)
		}
		at, ok := sent[string(f.ID)]
		if !ok {
			t.Fatalf("answer to %s, want one to each status once", f.ID)
		}
		delete(sent, string(f.ID))
		if took := time.Since(at); took < timeout {
			t.Fatalf("status %s answered %v after it was sent, before its deadline (%v)", f.ID, took, timeout)
		}
	}

	// A client leaving with statuses pending, on a gateway whose deadlines
	// are far: whatever holds the connection now is the hung read.
	sess = newHungSession(t)
	g, socket := runGateway(t, sess, time.Hour)
	leaver := dialInitialized(t, socket)
	for id := range 3 {
		if err := leaver.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"status","params":{}}`, id)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Recv(t, sess.calls)
	// Its statuses wait an hour: the only answer there can be is health's.
	if err := leaver.Send(`{"jsonrpc":"2.0","id":"h","method":"health","params":{}}`); err != nil {
		t.Fatal(err)
	}
	if f, _, err := leaver.Read(10 * time.Second); err != nil || string(f.ID) != `"h"` || f.Error != nil {
		t.Fatalf("answer %+v, %v; want health's while the statuses wait", f, err)
	}
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
		if n := g.statusReads.Len(); n != 1 {
			return fmt.Errorf("%d keys with callers, want the leaver's", n)
		}
		return nil
	})
	leaver.Close()
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
		g.mu.Lock()
		open := len(g.states)
		g.mu.Unlock()
		if open != 0 {
			return fmt.Errorf("%d connection states left after the client went", open)
		}
		return nil
	})
	// The hung read still holds its key (a status arriving now would wait
	// for it rather than start a second read beside it), and no batch was
	// run for the callers that left.
	if n := g.statusReads.Len(); n != 1 {
		t.Fatalf("%d keys held, want the hung read's", n)
	}
	select {
	case <-sess.calls:
		t.Fatal("a read was started for callers that had left")
	case <-time.After(100 * time.Millisecond):
	}
}
