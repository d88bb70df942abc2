package jsonrpc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// deferredHandler takes "later" requests on the read loop and hands their
// replies to the test; every other method goes to testHandler.
type deferredHandler struct {
	testHandler
	replies chan pendingReply
	// onCtxEnd, when set, answers a pending request when its ctx ends.
	onCtxEnd bool
}

type pendingReply struct {
	id    string
	reply Reply
}

func (h *deferredHandler) HandleDeferred(ctx context.Context, c *Conn, req *Request, reply Reply) {
	if req.Method == "later-panic" {
		panic("deferred handler bug")
	}
	if h.onCtxEnd {
		context.AfterFunc(ctx, func() { reply(nil, NewError(CodeInternal, "closing", nil)) })
	}
	h.replies <- pendingReply{req.ID.String(), reply}
}

func deferredServer(t *testing.T, opts Options, h *deferredHandler) *testServer {
	t.Helper()
	opts.Deferred = func(m string) bool { return strings.HasPrefix(m, "later") }
	return startServer(t, &Server{Options: opts, NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
}

// Deferred requests hold no goroutine and do not hold the read loop: a
// request read after them is answered first, and each deferred one is
// answered, with its own id, when (and from where) its reply is given.
func TestDeferredRequestsAnsweredLater(t *testing.T) {
	h := &deferredHandler{replies: make(chan pendingReply, 8)}
	ts := deferredServer(t, Options{}, h)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"later"}`,
		`{"jsonrpc":"2.0","id":2,"method":"later"}`,
		`{"jsonrpc":"2.0","id":3,"method":"echo","params":{"x":1}}`)
	if m := c.recvMsg(); string(m.ID) != "3" {
		t.Fatalf("first reply %s, want the echo's (id 3) while 1 and 2 wait", m)
	}
	p1, p2 := testwait.Recv(t, h.replies), testwait.Recv(t, h.replies)
	if p1.id != "1" || p2.id != "2" {
		t.Fatalf("handed %s then %s, want arrival order", p1.id, p2.id)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p2.reply(map[string]int{"n": 2}, nil)
		p1.reply(nil, fmt.Errorf("wrapped: %w", NewError(CodeSessionNotFound, "Session not found", nil)))
		p1.reply("a second reply is ignored", nil)
	}()
	testwait.Recv(t, done)
	if m := c.recvMsg(); string(m.ID) != "2" || string(m.Result) != `{"n":2}` {
		t.Fatalf("got %s, want id 2's result", m)
	}
	if m := c.recvMsg(); string(m.ID) != "1" || m.Error == nil || m.Error.Code != CodeSessionNotFound {
		t.Fatalf("got %s, want id 1's error", m)
	}
	c.send(`{"jsonrpc":"2.0","id":4,"method":"echo","params":4}`)
	if m := c.recvMsg(); string(m.ID) != "4" {
		t.Fatalf("got %s after the ignored second reply, want id 4", m)
	}
}

// A deferred reply given after the socket's last direct write left its
// write deadline behind, and that deadline has passed, still goes out,
// and the connection stays open (it was closed: the non-blocking write
// failed on the stale deadline).
func TestDeferredReplyAfterAStaleWriteDeadline(t *testing.T) {
	h := &deferredHandler{replies: make(chan pendingReply, 8)}
	ts := deferredServer(t, Options{WriteStallTimeout: 50 * time.Millisecond}, h)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"echo","params":1}`)
	c.recvMsg()
	time.Sleep(200 * time.Millisecond) // past the deadline that write set
	c.send(`{"jsonrpc":"2.0","id":2,"method":"later"}`)
	testwait.Recv(t, h.replies).reply("ok", nil)
	if m := c.recvMsg(); string(m.ID) != "2" || string(m.Result) != `"ok"` {
		t.Fatalf("got %s, want id 2's result", m)
	}
	c.send(`{"jsonrpc":"2.0","id":3,"method":"echo","params":3}`)
	if m := c.recvMsg(); string(m.ID) != "3" {
		t.Fatalf("got %s; the connection should still serve", m)
	}
}

// Reply never blocks, even for a peer that reads nothing: a goroutine
// answering the requests of many connections is never held by one of
// them. What the socket does not take is queued, in order, ahead of
// nothing, and arrives whole once the peer reads.
func TestDeferredReplyNeverBlocks(t *testing.T) {
	h := &deferredHandler{replies: make(chan pendingReply, 16)}
	ts := deferredServer(t, Options{MaxPendingBytes: 64 << 10}, h)
	c := dial(t, ts.path)
	const n = 8
	for i := range n {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"later"}`, i))
	}
	big := strings.Repeat("y", 256<<10) // each reply alone is past the socket's buffer
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		for range n {
			p := <-h.replies
			p.reply(p.id+big, nil)
		}
	}()
	select {
	case <-answered:
	case <-time.After(waitFor):
		t.Fatal("Reply blocked on a peer that reads nothing")
	}
	for i := range n {
		m := c.recvMsg()
		if want := fmt.Sprintf(`"%d%s"`, i, big); string(m.ID) != fmt.Sprint(i) || string(m.Result) != want {
			t.Fatalf("reply %d: id %s, %d bytes of result; want id %d whole", i, m.ID, len(m.Result), i)
		}
	}
}

// A deferred handler that panics is answered -32603; a connection that
// closes with deferred requests pending returns from Run once the handler
// has answered them (here, when their ctx ends).
func TestDeferredPanicAndClose(t *testing.T) {
	h := &deferredHandler{replies: make(chan pendingReply, 8), onCtxEnd: true}
	ts := deferredServer(t, Options{}, h)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"later-panic"}`)
	if m := c.recvMsg(); m.Error == nil || m.Error.Code != CodeInternal {
		t.Fatalf("got %s, want -32603", m)
	}
	c.send(`{"jsonrpc":"2.0","id":2,"method":"later"}`, `{"jsonrpc":"2.0","id":3,"method":"later"}`)
	testwait.Recv(t, h.replies)
	testwait.Recv(t, h.replies)
	c.nc.Close()
	select {
	case <-ts.disconnects:
	case <-time.After(waitFor):
		t.Fatal("Run did not return with deferred requests answered at close")
	}
}

// Replies given from many goroutines at once to one connection each come
// out whole (run with -race).
func TestDeferredRepliesConcurrent(t *testing.T) {
	h := &deferredHandler{replies: make(chan pendingReply, 64)}
	ts := deferredServer(t, Options{}, h)
	c := dial(t, ts.path)
	const n = 64
	for i := range n {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"later"}`, i))
	}
	var wg sync.WaitGroup
	for range n {
		p := testwait.Recv(t, h.replies)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.reply(strings.Repeat("z", 3000), nil)
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for range n {
		m := c.recvMsg()
		if len(m.Result) != 3002 {
			t.Fatalf("reply %s: %d bytes of result, want 3002", m.ID, len(m.Result))
		}
		seen[string(m.ID)] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct replies, want %d", len(seen), n)
	}
}
