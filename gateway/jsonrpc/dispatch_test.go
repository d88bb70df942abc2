package jsonrpc

import (
	"context"
	"fmt"
	"testing"
)

// inlineGuardHandler serves inline: "boom" panics, "bye" closes its own
// connection and then returns a result, "ok" answers true.
type inlineGuardHandler struct{}

func (inlineGuardHandler) Handle(_ context.Context, c *Conn, req *Request) (any, error) {
	switch req.Method {
	case "boom":
		panic("inline handler panicked")
	case "bye":
		_ = c.Close()
		return "written after close", nil
	}
	return true, nil
}

func startInlineGuard(t *testing.T) *testServer {
	return startServer(t, &Server{
		Options:    Options{InitializeTimeout: -1, Inline: func(string) bool { return true }},
		NewHandler: func(*Conn, Peer) Handler { return inlineGuardHandler{} },
	}, nil)
}

// TestInlinePanicAnswersAndKeepsTheConnection: a handler answered on the
// read loop that panics gets the internal error as its answer, and the
// connection reads and answers on (the read loop's dispatch keeps the
// recover however it is trimmed).
func TestInlinePanicAnswersAndKeepsTheConnection(t *testing.T) {
	c := dial(t, startInlineGuard(t).path)
	for i := range 3 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"boom"}`, i))
		if m := c.recvMsg(); m.Error == nil || m.Error.Code != CodeInternal || m.Error.Message != "Internal error" ||
			string(m.ID) != fmt.Sprint(i) {
			t.Fatalf("panic %d answered %s; want the internal error with its id", i, m)
		}
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ok"}`, 10+i))
		if m := c.recvMsg(); m.Error != nil || string(m.Result) != "true" {
			t.Fatalf("request after panic %d answered %s; want true", i, m)
		}
	}
}

// TestInlineAnswerAfterCloseIsNotWritten: an inline handler that closes
// its connection has its result dropped, not written after the close.
func TestInlineAnswerAfterCloseIsNotWritten(t *testing.T) {
	c := dial(t, startInlineGuard(t).path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ok"}`)
	if m := c.recvMsg(); string(m.Result) != "true" {
		t.Fatalf("got %s; want true", m)
	}
	c.send(`{"jsonrpc":"2.0","id":2,"method":"bye"}`)
	c.expectEOF()
}
