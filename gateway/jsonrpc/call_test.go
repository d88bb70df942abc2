package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// askHandler's "ask" calls the client back with elicitation/create and
// reports what the call returned.
func askHandler() *testHandler {
	return &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		if req.Method != "ask" {
			return nil, MethodNotFound(req.Method)
		}
		raw, err := c.Call(ctx, "elicitation/create", map[string]any{"sessionId": "s", "mode": "form", "message": "Continue?"})
		var e *Error
		switch {
		case err == nil:
			return map[string]json.RawMessage{"result": raw}, nil
		case errors.As(err, &e):
			return map[string]any{"code": e.Code, "is_busy": errors.Is(err, &Error{Code: CodeSessionBusy})}, nil
		case errors.Is(err, ErrCallTimeout) && errors.Is(err, context.DeadlineExceeded):
			return map[string]string{"err": "timeout"}, nil
		}
		return nil, err
	}}
}

func startAsk(t *testing.T, opts Options) (*testServer, *client) {
	t.Helper()
	h := askHandler()
	ts := startServer(t, &Server{Options: opts, NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	return ts, dial(t, ts.path)
}

// expectCall reads the server's outgoing request and checks its id.
func expectCall(t *testing.T, c *client, id string) wireMsg {
	t.Helper()
	m := c.recvMsg()
	if m.Method != "elicitation/create" || string(m.ID) != `"`+id+`"` {
		t.Fatalf("got %v, want elicitation/create with id %s", m, id)
	}
	return m
}

// TestSameIDBothWays: the client's request "zc-out-0" and the server's own
// outgoing "zc-out-0" are in flight at once and each is answered
// independently.
func TestSameIDBothWays(t *testing.T) {
	_, c := startAsk(t, Options{})
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","method":"ask"}`)
	expectCall(t, c, "zc-out-0") // both directions now have zc-out-0 pending
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","result":{"action":"accept","content":{"choice":"allow_once"}}}`)
	m := c.recvMsg()
	if string(m.ID) != `"zc-out-0"` || m.Method != "" || m.Error != nil {
		t.Fatalf("got %v, want the response to the client's zc-out-0", m)
	}
	if want := `{"result":{"action":"accept","content":{"choice":"allow_once"}}}`; string(m.Result) != want {
		t.Fatalf("result %s, want %s", m.Result, want)
	}
	// The next outgoing id counts on.
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","method":"ask"}`)
	expectCall(t, c, "zc-out-1")
}

// TestCallResultNull: an explicit "result": null resolves the caller.
func TestCallResultNull(t *testing.T) {
	_, c := startAsk(t, Options{})
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ask"}`)
	expectCall(t, c, "zc-out-0")
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","result":null}`)
	if m := c.recvMsg(); string(m.Result) != `{"result":null}` {
		t.Fatalf("got %v", m)
	}
}

// TestCallErrorReply: an error object resolves the caller as *Error.
func TestCallErrorReply(t *testing.T) {
	_, c := startAsk(t, Options{})
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ask"}`)
	expectCall(t, c, "zc-out-0")
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","error":{"code":-32002,"message":"busy","data":{"reason":"conflict"}}}`)
	if m := c.recvMsg(); string(m.Result) != `{"code":-32002,"is_busy":true}` {
		t.Fatalf("got %v", m)
	}
}

// TestCallUnknownAndMalformedReplies: a valid response with an unknown id
// and a malformed response carrying the pending id both complete nothing
// and get no reply; the proper response then completes the call.
func TestCallUnknownAndMalformedReplies(t *testing.T) {
	ts, c := startAsk(t, Options{})
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ask"}`)
	expectCall(t, c, "zc-out-0")
	c.send(
		`{"jsonrpc":"2.0","id":"zc-out-7","result":"unknown id"}`,
		`{"jsonrpc":"2.0","id":0,"result":"number, not the string zc-out-0"}`,
		`{"jsonrpc":"2.0","id":"zc-out-0","result":"both","error":{"code":1,"message":"m"}}`,
		`{"jsonrpc":"2.0","id":"zc-out-0","error":{"code":"x","message":"m"}}`,
		`{"jsonrpc":"1.0","id":"zc-out-0","result":"old"}`,
		`{"jsonrpc":"2.0","id":"zc-out-0","result":"extra params","params":{}}`,
		`{"jsonrpc":"2.0","id":2,"method":"echo","params":["sentinel"]}`,
	)
	if m := c.recvMsg(); string(m.ID) != "2" {
		t.Fatalf("got %v, want only the sentinel's reply", m)
	}
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","result":"proper"}`)
	if m := c.recvMsg(); string(m.ID) != "1" || string(m.Result) != `{"result":"proper"}` {
		t.Fatalf("got %v", m)
	}
	if n := ts.logs.FilterMessage("response for no pending request ignored").Len(); n != 2 {
		t.Fatalf("%d unknown-id logs, want 2", n)
	}
	if n := ts.logs.FilterMessage("malformed response dropped").Len(); n != 4 {
		t.Fatalf("%d malformed-response logs, want 4", n)
	}
}

// TestCallTimeout: with no ctx deadline, CallTimeout fails the call with
// ErrCallTimeout; a late answer is then ignored.
func TestCallTimeout(t *testing.T) {
	ts, c := startAsk(t, Options{CallTimeout: 100 * time.Millisecond})
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ask"}`)
	expectCall(t, c, "zc-out-0")
	if m := c.recvMsg(); string(m.Result) != `{"err":"timeout"}` {
		t.Fatalf("got %v", m)
	}
	c.send(`{"jsonrpc":"2.0","id":"zc-out-0","result":"late"}`,
		`{"jsonrpc":"2.0","id":2,"method":"echo"}`)
	if m := c.recvMsg(); string(m.ID) != "2" {
		t.Fatalf("got %v", m)
	}
	if n := ts.logs.FilterMessage("response for no pending request ignored").Len(); n != 1 {
		t.Fatalf("late answer not logged as unknown")
	}
}

// TestCallFailsOnClose: a pending call fails with ErrClosed when the
// connection goes away, and the handler's ctx carries the cause.
func TestCallFailsOnClose(t *testing.T) {
	got := make(chan error, 1)
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		_, err := c.Call(ctx, "elicitation/create", nil)
		got <- err
		return nil, err
	}}
	ts := startServer(t, &Server{NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"ask"}`)
	m := c.recvMsg()
	if m.Method != "elicitation/create" || len(m.Params) != 0 {
		t.Fatalf("got %v", m)
	}
	c.nc.Close()
	if err := testwait.Recv(t, got); !errors.Is(err, ErrClosed) {
		t.Fatalf("Call returned %v, want ErrClosed", err)
	}
	if err := testwait.Recv(t, ts.disconnects); err != nil {
		t.Fatalf("Run returned %v for a peer hang-up", err)
	}
}

// TestHalfClose: a client that shuts down its sending side still gets the
// answers to what it sent, then end of stream.
func TestHalfClose(t *testing.T) {
	release := make(chan struct{})
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		<-release
		return "slow done", nil
	}}
	ts := startServer(t, &Server{NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"slow"}`, `{"jsonrpc":"2.0","id":2,"method":"echo"}`)
	if err := c.nc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if m := c.recvMsg(); string(m.ID) != "2" {
		t.Fatalf("got %v", m)
	}
	close(release)
	if m := c.recvMsg(); string(m.ID) != "1" || string(m.Result) != `"slow done"` {
		t.Fatalf("got %v", m)
	}
	c.expectEOF()
	if err := testwait.Recv(t, ts.disconnects); err != nil {
		t.Fatalf("Run returned %v", err)
	}
}

// heldUntilCancelled starts a server whose handler holds each call
// until its context ends, then sends that context's cause on cause; it
// sends a request of method (id 1) on a new connection, c, and returns
// once the handler holds it.
func heldUntilCancelled(t *testing.T, method string) (ts *testServer, c *client, cause <-chan error) {
	t.Helper()
	started, causes := make(chan struct{}), make(chan error, 1)
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		close(started)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}}
	ts = startServer(t, &Server{NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c = dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"` + method + `"}`)
	testwait.Recv(t, started)
	return ts, c, causes
}

// TestHangUpCancels: a client that closes its socket has its in-flight
// handlers cancelled at once (a turn it started ends).
func TestHangUpCancels(t *testing.T) {
	ts, c, cause := heldUntilCancelled(t, "turn")
	c.nc.Close()
	if err := testwait.Recv(t, cause); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("cause %v", err)
	}
	testwait.Recv(t, ts.disconnects)
}

// TestShutdownDrains: Shutdown stops accepting, lets the in-flight request
// finish and be answered, refuses new requests meanwhile, then closes.
func TestShutdownDrains(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{})
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		close(started)
		<-release
		return "finished", nil
	}}
	ts := startServer(t, &Server{NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"slow"}`)
	testwait.Recv(t, started)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		done <- ts.Shutdown(ctx)
	}()
	// New requests are refused while draining.
	checkFor(t, func() error {
		c.send(`{"jsonrpc":"2.0","id":2,"method":"echo"}`)
		m := c.recvMsg()
		if m.Error == nil || m.Error.Message != "Server is shutting down" {
			return fmt.Errorf("got %v", m)
		}
		return nil
	})
	if _, err := dialErr(ts.path); err == nil {
		t.Fatalf("still accepting after Shutdown")
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	default:
	}
	close(release)
	if m := c.recvMsg(); string(m.ID) != "1" || string(m.Result) != `"finished"` {
		t.Fatalf("got %v", m)
	}
	c.expectEOF()
	if err := testwait.Recv(t, done); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := ts.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

// TestShutdownDeadline: when the drain outlasts Shutdown's ctx, the
// connection is closed, the handler's ctx cancelled, and Shutdown reports
// the ctx error.
func TestShutdownDeadline(t *testing.T) {
	ts, c, cause := heldUntilCancelled(t, "forever")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := ts.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown returned %v", err)
	}
	if err := testwait.Recv(t, cause); !errors.Is(err, ErrShutdown) {
		t.Fatalf("handler cause %v", err)
	}
	c.expectEOF()
}

// TestNotifyOrder: notifications from one goroutine arrive in order, and
// the response to the request that streamed them comes after them.
func TestNotifyOrder(t *testing.T) {
	const n = 2000
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		for i := 0; i < n; i++ {
			if err := c.Notify(ctx, "session/update", map[string]int{"seq": i}); err != nil {
				return nil, err
			}
		}
		return "streamed", nil
	}}
	ts := startServer(t, &Server{NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"stream"}`)
	for i := 0; i < n; i++ {
		m := c.recvMsg()
		if m.Method != "session/update" || m.ID != nil || string(m.Params) != fmt.Sprintf(`{"seq":%d}`, i) {
			t.Fatalf("notification %d: got %v", i, m)
		}
	}
	if m := c.recvMsg(); string(m.Result) != `"streamed"` {
		t.Fatalf("got %v", m)
	}
}

// TestConnOverPipe drives a bare Conn over net.Pipe: Run returns only
// after the handlers it started have returned, Close is safe twice, and
// calls after close fail with ErrClosed.
func TestConnOverPipe(t *testing.T) {
	srv, cli := net.Pipe()
	defer cli.Close()
	entered, finished := make(chan struct{}), make(chan struct{})
	conn := NewConn(srv, HandlerFunc(func(ctx context.Context, c *Conn, req *Request) (any, error) {
		close(entered)
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // a handler slow to notice
		close(finished)
		return nil, nil
	}), Options{InitializeTimeout: -1})
	ran := make(chan error, 1)
	go func() { ran <- conn.Run(context.Background()) }()
	go io.WriteString(cli, `{"jsonrpc":"2.0","id":1,"method":"x"}`+"\n")
	testwait.Recv(t, entered)
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := testwait.Recv(t, ran); err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case <-finished:
	default:
		t.Fatalf("Run returned before its handler")
	}
	testwait.Recv(t, conn.Done())
	if _, err := conn.Call(context.Background(), "m", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Call after Close: %v", err)
	}
	if err := conn.Notify(context.Background(), "m", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Notify after Close: %v", err)
	}
}

// An EncodedJSON result is written as it is; a RawMessage one is checked.
func TestEncodedResults(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{
		{EncodedJSON(`{"a":1}`), `{"a":1}`},
		{EncodedJSON(nil), `null`},
		{json.RawMessage(`{"a":1}`), `{"a":1}`},
		{json.RawMessage("{\n\"a\": 1}"), `{"a":1}`},
		{map[string]int{"a": 1}, `{"a":1}`},
	} {
		got, err := marshalResult(tc.in)
		if err != nil || string(got) != tc.want {
			t.Errorf("marshalResult(%#v) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// TestEndOfStreamWithTheLastFrame: a client whose last frame and end
// of stream are both in the socket before the server reads either (here
// while the read loop is held in an inline handler) gets its answer, if
// the frame asks for one, then end of stream. The poller's one wake-up
// stands for both: a reader that took a short read to mean "nothing more
// until the poller says so" saw the end only when something else woke
// the socket (the client reading an answer), and never after a
// notification.
//
// The last case is a frame with no LF, ended by the end of stream: the
// read that brings it is short, and a reader that waited after it for
// the rest never answered it.
func TestEndOfStreamWithTheLastFrame(t *testing.T) {
	for _, last := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":["last"]}` + "\n",
		`{"jsonrpc":"2.0","method":"note"}` + "\n",
		`{"jsonrpc":"2.0","id":1,"method":"echo","params":["last"]}`,
	} {
		t.Run(last, func(t *testing.T) {
			held, release := make(chan struct{}), make(chan struct{})
			h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
				if req.Method == "hold" {
					close(held)
					<-release
				}
				return nil, nil
			}}
			ts := startServer(t, &Server{
				Options:    Options{InitializeTimeout: -1, Inline: func(m string) bool { return m == "hold" }},
				NewHandler: func(*Conn, Peer) Handler { return h },
			}, nil)
			c := dial(t, ts.path)
			c.send(`{"jsonrpc":"2.0","method":"hold"}`)
			testwait.Recv(t, held)
			if _, err := io.WriteString(c.nc, last); err != nil {
				t.Fatal(err)
			}
			// A Unix socket's write and shutdown are in the server's end when
			// they return: both wait there for the held loop.
			if err := c.nc.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			close(release)
			if strings.Contains(last, `"id"`) {
				if m := c.recvMsg(); string(m.ID) != "1" || string(m.Result) != `["last"]` {
					t.Fatalf("got %v", m)
				}
			}
			c.expectEOF()
			if err := testwait.Recv(t, ts.disconnects); err != nil {
				t.Fatalf("Run returned %v", err)
			}
		})
	}
}
