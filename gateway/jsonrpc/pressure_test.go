package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
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
	if err := testwait.Recv(t, ts.disconnects); !errors.Is(err, ErrWriteStall) {
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

// TestFrameBudget: n connections each send an unfinished frame larger
// than budget/n. The bytes reserved never exceed the budget, some
// connections wait for it, the heap grows by at most the budget plus a
// documented constant (64 KiB of initial buffer a connection and 4 MiB for
// everything else), every connection gets frame_timeout at its deadline,
// and once they have closed the budget is whole again.
func TestFrameBudget(t *testing.T) {
	const (
		conns      = 8
		budgetSize = 8 << 20
		frameBytes = 3 << 20 // > budgetSize/conns
		timeout    = 2 * time.Second
	)
	budget := NewFrameBudget(budgetSize)
	ts := startServer(t, &Server{Options: Options{FrameTimeout: timeout, FrameBudget: budget}}, nil)
	payload := []byte(`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"pad":"` + strings.Repeat("x", frameBytes))
	before := heapInuse()

	type outcome struct {
		m       wireMsg
		elapsed time.Duration
		eof     bool
	}
	results := make(chan outcome, conns)
	for i := 0; i < conns; i++ {
		c := dial(t, ts.path)
		go func() {
			start := time.Now()
			go c.nc.Write(payload) // fails once the server closes; that is expected
			line, err := c.recvErr()
			var o outcome
			o.elapsed = time.Since(start)
			if err == nil {
				_ = json.Unmarshal([]byte(line), &o.m)
				o.m.line = line
				_, err = c.recvErr()
				o.eof = err != nil
			}
			results <- o
		}()
	}
	var growth int64
	var got []outcome
	for len(got) < conns {
		select {
		case o := <-results:
			got = append(got, o)
		case <-time.After(50 * time.Millisecond):
		}
		if r := budget.Reserved(); r > budgetSize {
			t.Fatalf("%d bytes reserved, budget %d", r, budgetSize)
		}
		if len(got) == 0 {
			growth = max(growth, heapInuse()-before)
		}
	}
	budget.mu.Lock()
	peak, waits := budget.peak, budget.waits
	budget.mu.Unlock()
	// 8 MiB of slack for the test's own goroutines and the race
	// detector's bookkeeping; the code before the budget grew 29 MiB.
	bound := int64(budgetSize + conns*initialFrameBuf + 8<<20)
	t.Logf("peak reserved %.1f MiB of %.1f, %d waits, peak heap growth %.1f MiB (bound %.1f MiB)",
		float64(peak)/(1<<20), float64(budgetSize)/(1<<20), waits, float64(growth)/(1<<20), float64(bound)/(1<<20))
	if peak > budgetSize {
		t.Errorf("peak reservation %d over the budget %d", peak, budgetSize)
	}
	if waits == 0 {
		t.Errorf("no connection waited for budget: the test did not exhaust it")
	}
	if growth > bound {
		t.Errorf("heap grew by %d bytes, bound %d", growth, bound)
	}
	for _, o := range got {
		if o.m.Error == nil || o.m.Error.Code != CodeInvalidRequest || string(o.m.ID) != "null" {
			t.Errorf("got %v, want -32600 frame_timeout", o.m)
			continue
		}
		if d := errData(t, o.m.Error); d["reason"] != "frame_timeout" {
			t.Errorf("data %s", o.m.Error.Data)
		}
		if o.elapsed < timeout || !o.eof {
			t.Errorf("reply after %v (limit %v), closed after: %v", o.elapsed, timeout, o.eof)
		}
	}
	for i := 0; i < conns; i++ {
		if err := testwait.Recv(t, ts.disconnects); !errors.Is(err, ErrFrameTimeout) {
			t.Errorf("Run returned %v, want ErrFrameTimeout", err)
		}
	}
	if r := budget.Reserved(); r != 0 {
		t.Errorf("%d bytes still reserved after every connection closed", r)
	}
}

// TestFrameBudgetLargeFramesServed: frames larger than the initial buffer
// are served under a budget that holds one at a time, pipelined on one
// connection and spread over several, and the budget is whole afterwards;
// a large frame is handed over without a copy.
func TestFrameBudgetLargeFramesServed(t *testing.T) {
	budget := NewFrameBudget(2 << 20)
	ts := startServer(t, &Server{Options: Options{FrameBudget: budget},
		NewHandler: func(*Conn, Peer) Handler { return &testHandler{} }}, nil)
	big := func(id, n int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"echo","params":["%s"]}`, id, strings.Repeat("b", n))
	}
	c := dial(t, ts.path)
	// Pipelined: a large frame, a small one right behind it, another large.
	go c.nc.Write([]byte(big(1, 300<<10) + "\n" + `{"jsonrpc":"2.0","id":2,"method":"echo","params":[2]}` + "\n" + big(3, 900<<10) + "\n"))
	lens := map[string]int{}
	for i := 0; i < 3; i++ {
		m := c.recvMsg()
		var p []json.RawMessage
		_ = json.Unmarshal(m.Result, &p)
		if len(p) == 1 {
			lens[string(m.ID)] = len(p[0])
		}
	}
	if lens["1"] != 300<<10+2 || lens["2"] != 1 || lens["3"] != 900<<10+2 {
		t.Fatalf("echoed params lengths %v", lens)
	}
	checkFor(t, func() error {
		if r := budget.Reserved(); r != 0 {
			return fmt.Errorf("%d bytes reserved between frames", r)
		}
		return nil
	})

	// Own hands a large frame over and keeps what follows it.
	fr := NewFrameReader(strings.NewReader(big(4, 200<<10)+"\n"+`{"x":1}`+"\n"), 0, 0)
	fr.UseBudget(budget, nil)
	line, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	owned, _ := fr.Own(line)
	if &owned[0] != &line[0] {
		t.Errorf("a large frame was copied")
	}
	if next, err := fr.ReadFrame(); err != nil || string(next) != `{"x":1}` {
		t.Errorf("frame after a handed-over one: %q, %v", next, err)
	}
	if string(owned[len(owned)-3:]) != `"]}` {
		t.Errorf("the handed-over frame changed: ...%q", owned[len(owned)-3:])
	}
	fr.Release()
	if r := budget.Reserved(); r != 0 {
		t.Errorf("%d bytes reserved after Release", r)
	}
}

// A Server without a budget makes one of the documented default.
func TestFrameBudgetDefault(t *testing.T) {
	ts := startServer(t, &Server{}, nil)
	dial(t, ts.path)
	onlyConn(t, ts.Server)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.budget == nil || ts.budget.Capacity() != 128<<20 || DefaultMaxBufferedFrameBytes != 128<<20 {
		t.Fatalf("default budget %+v", ts.budget)
	}
}

// TestHeldRequestDispatchedWhenRoomFrees: at the in-flight bound, with an
// outgoing call still unanswered, a request read meanwhile is held; when
// another handler ends it is served at once, though the peer sends
// nothing more (it may be waiting for exactly that reply, e.g. a cancel).
// An inline request read while over the bound runs at once.
func TestHeldRequestDispatchedWhenRoomFrees(t *testing.T) {
	release := make(chan struct{})
	h := askHandler()
	ask := h.onCall
	h.onCall = func(ctx context.Context, c *Conn, req *Request) (any, error) {
		if req.Method == "slow" {
			<-release
			return "slow done", nil
		}
		return ask(ctx, c, req)
	}
	ts := startServer(t, &Server{Options: Options{MaxInflightRequests: 2, CallTimeout: 3 * waitFor,
		Inline: func(m string) bool { return m == "initialize" }},
		NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":"a","method":"ask"}`)
	expectCall(t, c, "zc-out-0") // left unanswered until the end
	c.send(`{"jsonrpc":"2.0","id":"b","method":"slow"}`)
	conn := onlyConn(t, ts.Server)
	checkFor(t, func() error {
		if n := conn.active.Load(); n != 2 {
			return fmt.Errorf("%d in flight", n)
		}
		return nil
	})
	c.send(`{"jsonrpc":"2.0","id":"c","method":"echo","params":["c"]}`)
	checkFor(t, func() error {
		if conn.held.Load() == nil {
			return errors.New("nothing held yet")
		}
		return nil
	})
	c.send(`{"jsonrpc":"2.0","id":"i","method":"initialize"}`)
	if m := c.recvMsg(); string(m.ID) != `"i"` {
		t.Fatalf("got %v, want the inline initialize served over the bound", m)
	}
	close(release)
	got := map[string]string{}
	for i := 0; i < 2; i++ {
		m := c.recvMsg()
		got[string(m.ID)] = string(m.Result)
	}
	if got[`"b"`] != `"slow done"` || got[`"c"`] != `["c"]` {
		t.Fatalf("replies %v, want b and the held c", got)
	}
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","result":{"action":"cancel"}}`)
	if m := c.recvMsg(); string(m.ID) != `"a"` {
		t.Fatalf("got %v", m)
	}
}

// The frame budget counts a frame until it is handed to its handler; one
// whose handler waits (a prompt for its turn, a config write for the lock)
// held its frame uncounted, 64 of the largest a connection. A
// connection's requests in flight hold at most two largest frames'
// worth: past that it reads no more until one finishes, and every
// request is served in the end.
func TestHeldFramesBoundTheReading(t *testing.T) {
	const (
		maxFrame = 256 << 10
		frame    = 200 << 10
		requests = 10
	)
	release := make(chan struct{})
	var started atomic.Int64
	h := HandlerFunc(func(ctx context.Context, c *Conn, req *Request) (any, error) {
		started.Add(1)
		<-release
		return len(req.Params), nil
	})
	ts := startServer(t, &Server{
		Options:    Options{InitializeTimeout: -1, MaxFrameBytes: maxFrame, MaxInflightRequests: 64},
		NewHandler: func(*Conn, Peer) Handler { return h },
	}, nil)
	c := dial(t, ts.path)
	var b strings.Builder
	for i := range requests {
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"wait","params":{"pad":"%s"}}`+"\n", i, strings.Repeat("p", frame))
	}
	go c.nc.Write([]byte(b.String())) // blocks once the server stops reading

	conn := onlyConn(t, ts.Server)
	checkFor(t, func() error {
		if !conn.readGated.Load() || started.Load() == 0 {
			return fmt.Errorf("gated %v, %d started", conn.readGated.Load(), started.Load())
		}
		return nil
	})
	// Read while under the bound: at most one frame (its buffer, up to 64
	// KiB more than its bytes, rounded up as pooled) past it.
	n, held := started.Load(), conn.heldFrames.Load()
	close(release)
	if n >= requests || held > 2*maxFrame+2*frame {
		t.Fatalf("%d handlers hold %d bytes of frames; the bound is %d", n, held, 2*maxFrame)
	}
	t.Logf("%d of %d requests read, holding %d bytes of frames", n, requests, held)
	for range requests {
		if m := c.recvMsg(); m.Error != nil {
			t.Fatalf("answer: %+v", m)
		}
	}
	// A request's count goes once its answer is sent: shortly after the
	// client reads it.
	checkFor(t, func() error {
		if n := conn.heldFrames.Load(); n != 0 {
			return fmt.Errorf("%d bytes still counted once every request finished", n)
		}
		return nil
	})
}
