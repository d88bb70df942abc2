package jsonrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// blockHandler's "block" waits until its context is cancelled or
// "cancel" (a request or a notification) releases every block; it counts
// the blocks whose context was cancelled.
type blockHandler struct {
	release   chan struct{}
	once      sync.Once
	cancelled atomic.Int64
	started   atomic.Int64
}

func newBlockHandler() *blockHandler { return &blockHandler{release: make(chan struct{})} }

func (h *blockHandler) Handle(ctx context.Context, c *Conn, req *Request) (any, error) {
	switch req.Method {
	case "block":
		h.started.Add(1)
		select {
		case <-ctx.Done():
			h.cancelled.Add(1)
			return nil, ctx.Err()
		case <-h.release:
			return "released", nil
		}
	case "cancel":
		h.once.Do(func() { close(h.release) })
		return "cancelled", nil
	}
	return nil, MethodNotFound(req.Method)
}

func blockRequests(from, n int) []string {
	var out []string
	for i := from; i < from+n; i++ {
		out = append(out, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"block"}`, i))
	}
	return out
}

// TestHangUpAtBoundCancelsInflight: a client fills its in-flight bound
// with requests that last until cancelled (a prompt waiting on its turn)
// and hangs up. The connection closes at once and cancels their
// contexts. The read loop used to wait for room without reading, so the
// close was seen only when one of them ended: here, never. Also with two
// more requests sent past the bound (one held, one that stops the
// reading), where the loop reads nothing and must poll for the hang-up.
func TestHangUpAtBoundCancelsInflight(t *testing.T) {
	const limit = 4
	for _, tc := range []struct {
		name  string
		extra int // requests past the bound
	}{
		{"at the bound", 0},
		{"reading stopped past the bound", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newBlockHandler()
			ts := startServer(t, &Server{Options: Options{InitializeTimeout: -1, MaxInflightRequests: limit},
				NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
			c := dial(t, ts.path)
			c.send(blockRequests(0, limit+tc.extra)...)
			conn := onlyConn(t, ts.Server)
			checkFor(t, func() error {
				if n := conn.active.Load(); n != limit {
					return fmt.Errorf("%d in flight", n)
				}
				if tc.extra > 0 && !conn.readGated.Load() {
					return errors.New("the read loop is not stopped past the bound")
				}
				return nil
			})
			c.nc.Close()
			if err := testwait.Recv(t, ts.disconnects); err != nil {
				t.Fatalf("Run returned %v, want nil (the peer hung up)", err)
			}
			if n := h.cancelled.Load(); n != limit {
				t.Errorf("%d of %d requests had their context cancelled", n, limit)
			}
			if n := h.started.Load(); n != limit {
				t.Errorf("%d requests started, want %d (none past the bound)", n, limit)
			}
		})
	}
}

// TestUrgentReadAtBound: a client at its in-flight bound, with one more
// request sent past it, sends a cancel (Options.Urgent): it is read and
// served past the bound, the requests it releases end, and the held one
// is served after them. The read loop used to read nothing at the bound,
// so the cancel, the one request that could make room, waited for room.
// As a notification too (zerocode's chat sends session/cancel so).
func TestUrgentReadAtBound(t *testing.T) {
	const limit = 4
	for _, tc := range []struct {
		name, cancel string
	}{
		{"request", `{"jsonrpc":"2.0","id":"c","method":"cancel"}`},
		{"notification", `{"jsonrpc":"2.0","method":"cancel"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newBlockHandler()
			ts := startServer(t, &Server{Options: Options{InitializeTimeout: -1, MaxInflightRequests: limit,
				Urgent: func(m string) bool { return m == "cancel" }},
				NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
			c := dial(t, ts.path)
			c.send(blockRequests(0, limit)...)
			conn := onlyConn(t, ts.Server)
			checkFor(t, func() error {
				if n := conn.active.Load(); n != limit {
					return fmt.Errorf("%d in flight", n)
				}
				return nil
			})
			c.send(blockRequests(limit, 1)...) // held: no room for it
			checkFor(t, func() error {
				if conn.held.Load() == nil {
					return errors.New("nothing held")
				}
				return nil
			})
			c.send(tc.cancel)
			want := limit + 1
			if tc.name == "request" {
				want++
			}
			got := map[string]string{}
			for range want {
				m := c.recvMsg()
				if m.Error != nil {
					t.Fatalf("reply %v", m)
				}
				got[string(m.ID)] = string(m.Result)
			}
			for i := range limit + 1 {
				if r := got[fmt.Sprint(i)]; r != `"released"` {
					t.Errorf("reply to %d: %q (all: %v)", i, r, got)
				}
			}
			if tc.name == "request" && got[`"c"`] != `"cancelled"` {
				t.Errorf("reply to the cancel: %q", got[`"c"`])
			}
			if p := conn.peakActive.Load(); p > limit+UrgentReserve {
				t.Errorf("%d in flight at once, bound %d and %d urgent", p, limit, UrgentReserve)
			}
		})
	}
}

// TestUrgentReserveBounded: urgent requests past the bound are at most
// UrgentReserve in flight; the next waits for room like any request and
// is served once there is.
func TestUrgentReserveBounded(t *testing.T) {
	const limit = 2
	stuck := make(chan struct{})
	var urgentRunning, urgentPeak atomic.Int64
	h := HandlerFunc(func(ctx context.Context, c *Conn, req *Request) (any, error) {
		if req.Method == "urgent" {
			n := urgentRunning.Add(1)
			defer urgentRunning.Add(-1)
			for p := urgentPeak.Load(); n > p && !urgentPeak.CompareAndSwap(p, n); p = urgentPeak.Load() {
			}
		}
		select {
		case <-stuck:
			return "done", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	ts := startServer(t, &Server{Options: Options{InitializeTimeout: -1, MaxInflightRequests: limit,
		Urgent: func(m string) bool { return m == "urgent" }},
		NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	c.send(blockRequests(0, limit)...)
	for i := range UrgentReserve + 1 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":"u%d","method":"urgent"}`, i))
	}
	conn := onlyConn(t, ts.Server)
	checkFor(t, func() error {
		if n := conn.active.Load(); n != limit+UrgentReserve || conn.held.Load() == nil {
			return fmt.Errorf("%d in flight, held %v", n, conn.held.Load() != nil)
		}
		return nil
	})
	close(stuck)
	for range limit + UrgentReserve + 1 {
		if m := c.recvMsg(); m.Error != nil {
			t.Fatalf("reply %v", m)
		}
	}
	if p := conn.peakActive.Load(); p > limit+UrgentReserve {
		t.Errorf("%d in flight at once, bound %d and %d urgent", p, limit, UrgentReserve)
	}
	if p := urgentPeak.Load(); p > UrgentReserve {
		t.Errorf("%d urgent requests ran at once, reserve %d", p, UrgentReserve)
	}
}
