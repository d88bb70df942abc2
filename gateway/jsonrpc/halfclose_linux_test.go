//go:build linux

package jsonrpc

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// causeHandler's requests last until their context is cancelled (a
// prompt waiting on its turn), and report its cause.
type causeHandler struct {
	causes chan error
}

func (h *causeHandler) Handle(ctx context.Context, c *Conn, req *Request) (any, error) {
	<-ctx.Done()
	h.causes <- context.Cause(ctx)
	return nil, ctx.Err()
}

// TestHalfCloseThenHangUpCancelsInflight: a client sends requests that
// last until cancelled, shuts down its sending side (the server reads the
// end of stream and drains: what was sent is answered, then the
// connection closes), and then closes altogether. Its requests are
// cancelled, with ErrPeerClosed, and Run returns nil, as on any hang-up.
// The read loop had left after the end of stream and nothing looked at
// the socket again: the hang-up was seen only when an answer's write
// failed, so requests waiting for their context ran on for a client
// gone, here for ever. Also past the bound, with one request held when
// the end of stream is read: the loop waits for room for it and polls
// for the hang-up meanwhile (sleepForRoom), which already saw it.
func TestHalfCloseThenHangUpCancelsInflight(t *testing.T) {
	for _, tc := range []struct {
		name        string
		limit, sent int
		inflight    int
	}{
		{"below the bound", 0, 3, 3},
		{"one held past the bound", 2, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &causeHandler{causes: make(chan error, tc.sent)}
			ts := startServer(t, &Server{Options: Options{InitializeTimeout: -1, MaxInflightRequests: tc.limit},
				NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
			c := dial(t, ts.path)
			c.send(blockRequests(0, tc.sent)...)
			conn := onlyConn(t, ts.Server)
			checkFor(t, func() error {
				if n := int(conn.active.Load()); n != tc.inflight {
					return fmt.Errorf("%d in flight, want %d", n, tc.inflight)
				}
				return nil
			})
			if err := c.nc.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			// The end of stream is read before the close: else the close
			// is read as a hang-up, which always closed at once.
			checkFor(t, func() error {
				conn.hmu.Lock()
				draining := conn.draining
				conn.hmu.Unlock()
				if !draining && !conn.readGated.Load() {
					return errors.New("the end of stream is not read yet")
				}
				return nil
			})
			if err := c.nc.Close(); err != nil {
				t.Fatal(err)
			}
			// A failure bound, never a performance assertion: the poll
			// sees a hang-up within hangupPollMax.
			bound := time.NewTimer(waitFor)
			defer bound.Stop()
			for i := range tc.inflight {
				select {
				case err := <-h.causes:
					if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrPeerClosed) {
						t.Fatalf("request cancelled with %v, want ErrClosed wrapping ErrPeerClosed", err)
					}
				case <-bound.C:
					t.Fatalf("%d of %d requests cancelled within %v of the client's hang-up after its half-close",
						i, tc.inflight, waitFor)
				}
			}
			if err := testwait.Recv(t, ts.disconnects); err != nil {
				t.Fatalf("Run returned %v, want nil (the peer hung up)", err)
			}
		})
	}
}

// TestHalfCloseAnsweredWhilePolled: a half-closed client that stays,
// reading, is not taken for gone however long its requests last: the
// socket is polled for a hang-up meanwhile (POLLHUP, which a half-close
// does not set), and every answer is written before the connection
// closes.
func TestHalfCloseAnsweredWhilePolled(t *testing.T) {
	h := newBlockHandler()
	ts := startServer(t, &Server{Options: Options{InitializeTimeout: -1},
		NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	const n = 3
	c.send(blockRequests(0, n)...)
	conn := onlyConn(t, ts.Server)
	if err := c.nc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	checkFor(t, func() error {
		if p := conn.hupPolls.Load(); p < 3 {
			return fmt.Errorf("%d polls for a hang-up", p)
		}
		return nil
	})
	if conn.isClosed() {
		t.Fatalf("a half-closed client taken for gone: %v", conn.closedErr())
	}
	h.once.Do(func() { close(h.release) })
	got := map[string]bool{}
	for range n {
		m := c.recvMsg()
		if m.Error != nil || string(m.Result) != `"released"` {
			t.Fatalf("reply %v", m)
		}
		got[string(m.ID)] = true
	}
	if len(got) != n {
		t.Fatalf("replies to %v, want %d distinct", got, n)
	}
	c.expectEOF()
	if err := testwait.Recv(t, ts.disconnects); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if k := h.cancelled.Load(); k != 0 {
		t.Fatalf("%d requests cancelled", k)
	}
}
