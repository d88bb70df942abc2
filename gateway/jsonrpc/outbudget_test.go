package jsonrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// outputBudgetServer serves "page" (a reply of about 1 MiB, from the
// handler's goroutine) and "later" (deferred: the test gives the reply)
// with the output budget given and no write-stall rule, so that only the
// budget can close a peer that reads nothing.
func outputBudgetServer(t *testing.T, budget *OutputBudget) (*testServer, *deferredHandler, string) {
	t.Helper()
	page := strings.Repeat("p", 1<<20-64)
	h := &deferredHandler{replies: make(chan pendingReply, 64), testHandler: testHandler{
		onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
			if req.Method != "page" {
				return nil, MethodNotFound(req.Method)
			}
			return page, nil
		}}}
	ts := deferredServer(t, Options{OutputBudget: budget, MaxPendingBytes: 6 << 20, WriteStallTimeout: -1, InitializeTimeout: -1}, h)
	return ts, h, page
}

// closedOverBudget waits for the connection's end, which must be the
// budget's doing, and checks it gave back all it held: only others, what
// they charged, is held after.
func closedOverBudget(t *testing.T, ts *testServer, budget *OutputBudget, others int64) {
	t.Helper()
	if err := testwait.Recv(t, ts.disconnects); !errors.Is(err, ErrOutputOverBudget) {
		t.Fatalf("the connection ended with %v, want ErrOutputOverBudget", err)
	}
	if held := budget.Held(); held != others {
		t.Fatalf("budget holds %d bytes once the connection is closed, want %d", held, others)
	}
}

func pipelined(method string, n int) []string {
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q}`, i, method))
	}
	return lines
}

// A peer that pipelines requests and reads nothing holds its output
// queue (MaxPendingBytes) and, beside it, every reply whose sender waits
// for room in it: both count against the output budget, and the reply
// that would pass it closes the peer, which before held 6 MiB queued and
// 6 MiB waiting for good. What it held is given back, to the byte.
func TestOutputBudgetCountsRepliesWaitingForRoom(t *testing.T) {
	budget := NewOutputBudget(8 << 20)
	ts, _, _ := outputBudgetServer(t, budget)
	a := dial(t, ts.path)
	a.send(pipelined("page", 12)...)
	closedOverBudget(t, ts, budget, 0)
}

// Deferred replies cannot wait for room (their sender answers many
// connections): before the budget, all ten were queued whatever was
// held. Now the first 2 MiB are the peer's share, and the reply that
// would pass the budget past it closes the peer.
func TestOutputBudgetBoundsDeferredReplies(t *testing.T) {
	budget := NewOutputBudget(4 << 20)
	ts, h, page := outputBudgetServer(t, budget)
	b := dial(t, ts.path)
	b.send(pipelined("later", 10)...)
	var replies []pendingReply
	for range 10 {
		replies = append(replies, testwait.Recv(t, h.replies))
	}
	for _, r := range replies {
		r.reply(page, nil)
	}
	closedOverBudget(t, ts, budget, 0)
}

// While others spend the budget (the gateway's backlogs of updates
// charge it too), a peer that holds nothing still gets any reply, the
// largest included; one that holds a reply it has not read and would
// queue another is closed.
func TestOutputBudgetSpentByOthers(t *testing.T) {
	budget := NewOutputBudget(4 << 20)
	ts, h, page := outputBudgetServer(t, budget)
	budget.Charge(5 << 20)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"echo","params":[1]}`)
	if m := c.recvMsg(); string(m.ID) != "1" || string(m.Result) != "[1]" {
		t.Fatalf("a client holding nothing while the budget is spent: %s", m.line)
	}
	c.send(`{"jsonrpc":"2.0","id":2,"method":"page"}`)
	if m := c.recvMsg(); string(m.ID) != "2" || len(m.Result) != len(page)+2 {
		t.Fatalf("a client holding nothing got %d bytes of result for a page of %d", len(m.Result), len(page))
	}
	c.send(pipelined("later", 3)...)
	for range 3 {
		testwait.Recv(t, h.replies).reply(page, nil)
	}
	closedOverBudget(t, ts, budget, 5<<20)
}
