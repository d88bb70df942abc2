package jsonrpc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// heapInuse returns HeapInuse after a full collection.
func heapInuse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// onlyConn returns the server's one open connection.
func onlyConn(t *testing.T, s *Server) *Conn {
	t.Helper()
	var c *Conn
	checkFor(t, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		for k := range s.conns {
			c = k
		}
		if len(s.conns) != 1 {
			return fmt.Errorf("%d connections", len(s.conns))
		}
		return nil
	})
	return c
}

// TestPipelineBackPressure: a peer pipelines 300 requests whose replies
// are 1 MiB each and never reads. The connection stops reading at
// MaxInflightRequests in flight (handlers running plus encoded replies not
// yet queued) and while MaxPendingBytes are queued, so the heap grows by
// about cap × reply + MaxPendingBytes, not 300 MiB; the write-stall rule
// then closes it.
//
// Documented bound on the growth: (cap+2) × reply for the replies held
// by handlers and the one being written directly, 2 × MaxPendingBytes for
// the queue and the writer's batch (capacities round up), and 8 MiB for
// everything else (buffers, goroutines' heap objects, test bookkeeping).
func TestPipelineBackPressure(t *testing.T) {
	const (
		limit      = 8
		pending    = 4 << 20
		replyBytes = 1 << 20
		requests   = 300
	)
	reply := EncodedJSON(`"` + strings.Repeat("r", replyBytes-2) + `"`)
	var running, peak, started atomic.Int64
	h := HandlerFunc(func(ctx context.Context, c *Conn, req *Request) (any, error) {
		started.Add(1)
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return reply, nil
	})
	ts := startServer(t, &Server{
		Options: Options{InitializeTimeout: -1, WriteStallTimeout: time.Second,
			MaxPendingBytes: pending, MaxInflightRequests: limit},
		NewHandler: func(*Conn, Peer) Handler { return h },
	}, nil)

	before := heapInuse()
	c := dial(t, ts.path)
	var b strings.Builder
	for i := 0; i < requests; i++ {
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"big"}`+"\n", i)
	}
	go c.nc.Write([]byte(b.String())) // may block: the server stops reading

	conn := onlyConn(t, ts.Server)
	// Steady state: the read loop is held with the bound reached.
	checkFor(t, func() error {
		if !conn.readGated.Load() || conn.active.Load() != limit {
			return fmt.Errorf("gated %v, %d in flight, %d started", conn.readGated.Load(), conn.active.Load(), started.Load())
		}
		return nil
	})
	growth := heapInuse() - before
	bound := int64((limit+2)*replyBytes + 2*pending + 8<<20)
	t.Logf("%d of %d requests started, peak %d handlers, peak %d in flight, heap growth %.1f MiB (bound %.1f MiB)",
		started.Load(), requests, peak.Load(), conn.peakActive.Load(), float64(growth)/(1<<20), float64(bound)/(1<<20))
	if p := conn.peakActive.Load(); p > limit {
		t.Errorf("%d requests in flight at once, bound %d", p, limit)
	}
	if p := peak.Load(); p > limit {
		t.Errorf("%d handlers ran at once, bound %d", p, limit)
	}
	if s := started.Load(); s >= requests {
		t.Errorf("all %d requests were started for a peer that reads nothing", s)
	}
	if growth > bound {
		t.Errorf("heap grew by %d bytes, bound %d", growth, bound)
	}
	if err := <-ts.disconnects; !errors.Is(err, ErrWriteStall) {
		t.Fatalf("Run returned %v, want ErrWriteStall", err)
	}
}

// TestInflightCallsStillAnswered: with the connection at its in-flight
// bound, every handler waiting on a Call to the peer, the peer's answers
// are still read (the read loop reads on for outgoing calls) and each
// handler completes.
func TestInflightCallsStillAnswered(t *testing.T) {
	const limit = 4
	h := askHandler()
	ts := startServer(t, &Server{Options: Options{MaxInflightRequests: limit, CallTimeout: 3 * waitFor},
		NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	for i := 0; i < limit; i++ {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ask"}`, i))
	}
	ids := map[string]bool{}
	for i := 0; i < limit; i++ {
		m := c.recvMsg()
		ids[string(m.ID)] = true
	}
	conn := onlyConn(t, ts.Server)
	if n := conn.active.Load(); n != limit {
		t.Fatalf("%d in flight, want %d", n, limit)
	}
	// A request beyond the bound, then the answers behind it: the request
	// is held, the answers are read, and then the request is served too.
	c.send(`{"jsonrpc":"2.0","id":"extra","method":"echo","params":[1]}`)
	for id := range ids {
		c.send(`{"jsonrpc":"2.0","id":` + id + `,"result":{"action":"cancel"}}`)
	}
	// The call timeout is longer than recv waits: a deadlock fails here.
	got := map[string]string{}
	for i := 0; i < limit+1; i++ {
		m := c.recvMsg()
		got[string(m.ID)] = string(m.Result)
	}
	for want, result := range map[string]string{
		"0": `{"result":{"action":"cancel"}}`, "1": `{"result":{"action":"cancel"}}`,
		"2": `{"result":{"action":"cancel"}}`, "3": `{"result":{"action":"cancel"}}`, `"extra"`: `[1]`,
	} {
		if got[want] != result {
			t.Errorf("reply to %s: %q, want %s (all: %v)", want, got[want], result, got)
		}
	}
	if p := conn.peakActive.Load(); p > limit {
		t.Errorf("%d in flight at once, bound %d", p, limit)
	}
}

// The documented default.
func TestMaxInflightDefault(t *testing.T) {
	if got := (Options{}).withDefaults().MaxInflightRequests; got != 64 || DefaultMaxInflightRequests != 64 {
		t.Fatalf("default %d", got)
	}
}
