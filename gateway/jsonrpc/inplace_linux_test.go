//go:build linux

package jsonrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// socketPair returns the two ends of a Unix stream socket, the first
// non-blocking as the runtime makes a connection's.
func socketPair(t *testing.T) (ours, theirs int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	return fds[0], fds[1]
}

func readString(t *testing.T, s *socketSource, size int) (string, error) {
	t.Helper()
	buf := make([]byte, size)
	n, err := s.Read(buf)
	return string(buf[:n]), err
}

// TestSocketSourceWaitsAfterEmptyingTheSocket: after a read that emptied
// the socket, the source tries no read until the poller has reported the
// socket readable (bytes that came meanwhile stay in the socket); after a
// read that filled the buffer it reads on at once, as no new readiness
// would announce what was left behind.
func TestSocketSourceWaitsAfterEmptyingTheSocket(t *testing.T) {
	ours, theirs := socketPair(t)
	s := &socketSource{fd: ours}
	write := func(b string) {
		if _, err := unix.Write(theirs, []byte(b)); err != nil {
			t.Fatal(err)
		}
	}

	write("abc")
	if got, err := readString(t, s, 64); got != "abc" || err != nil {
		t.Fatalf("first read: %q, %v", got, err)
	}
	write("def")
	if got, err := readString(t, s, 64); got != "" || !errors.Is(err, errWouldBlock) {
		t.Fatalf("read after the socket was emptied: %q, %v; want no read (errWouldBlock)", got, err)
	}
	s.ready = true // the poller's word
	if got, err := readString(t, s, 64); got != "def" || err != nil {
		t.Fatalf("read after readiness: %q, %v", got, err)
	}

	write("0123456789")
	s.ready = true
	if got, err := readString(t, s, 4); got != "0123" || err != nil {
		t.Fatalf("a read that fills its buffer: %q, %v", got, err)
	}
	if got, err := readString(t, s, 4); got != "4567" || err != nil {
		t.Fatalf("the read after a full one, with no readiness reported: %q, %v", got, err)
	}
	if got, err := readString(t, s, 4); got != "89" || err != nil {
		t.Fatalf("%q, %v", got, err)
	}

	// Readiness that found nothing (an event for bytes already read): the
	// socket is empty again, and the next wait is the poller's.
	s.ready = true
	if got, err := readString(t, s, 4); got != "" || !errors.Is(err, errWouldBlock) {
		t.Fatalf("a read of an empty socket: %q, %v", got, err)
	}
	if !s.empty {
		t.Fatal("the source does not know the socket is empty")
	}

	unix.Shutdown(theirs, unix.SHUT_WR)
	s.ready = true
	if _, err := readString(t, s, 4); err != io.EOF {
		t.Fatalf("at the peer's end: %v, want io.EOF", err)
	}
}

// TestReadInPlaceServesEveryArrival: frames that were all in the socket
// before the loop read them (far more than one read's 64 KiB), a request
// byte by byte, and requests one at a time after each answer are all
// served on a connection read in place. A loop that waited for readiness
// after a read that filled its buffer would stop at the first 64 KiB of
// the burst for good: the burst is notifications, which write nothing
// back, so nothing happens on the socket after it to announce the rest.
func TestReadInPlaceServesEveryArrival(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		switch req.Method {
		case "hold":
			close(held)
			<-release
			return nil, nil
		case "note":
			return nil, nil
		}
		return nil, MethodNotFound(req.Method)
	}}
	ts := startServer(t, &Server{
		Options: Options{MaxInflightRequests: 4096, InitializeTimeout: -1,
			Inline: func(m string) bool { return m == "hold" }},
		NewHandler: func(*Conn, Peer) Handler { return h },
	}, nil)
	c := dial(t, ts.path)

	// The loop is held in an inline handler while the burst lands whole.
	c.send(`{"jsonrpc":"2.0","method":"hold"}`)
	testwait.Recv(t, held)
	const burst = 1800 // about 100 KiB, which the socket holds unread
	var b strings.Builder
	for i := range burst {
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","method":"note","params":[%d,%q]}`+"\n", i, strings.Repeat("p", 16))
	}
	if b.Len() < 80<<10 {
		t.Fatalf("the burst is %d bytes, not more than a read takes", b.Len())
	}
	if _, err := c.nc.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	close(release)
	checkFor(t, func() error {
		if n := len(h.notifications()); n != burst+1 {
			return fmt.Errorf("%d of %d notifications handled", n, burst+1)
		}
		return nil
	})

	line := `{"jsonrpc":"2.0","id":"slow","method":"echo"}` + "\n"
	for i := range len(line) {
		if _, err := c.nc.Write([]byte{line[i]}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // each byte its own arrival
	}
	if m := c.recvMsg(); string(m.ID) != `"slow"` {
		t.Fatalf("byte by byte: %v", m)
	}

	for i := range 200 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"echo"}`, i))
		if m := c.recvMsg(); string(m.ID) != fmt.Sprint(i) {
			t.Fatalf("closed loop, request %d: %v", i, m)
		}
	}
}

// TestCloseWhileReadingInPlace: a connection read in place closes at
// once, whoever closes it: a handler on another goroutine while the read
// loop waits for the socket or for room, and an inline handler on the
// read loop itself. net.Conn.Close waits for the loop to leave the
// socket's RawConn.Read; called as it was, the second waited on a loop
// that waited on it, and the third on itself.
func TestCloseWhileReadingInPlace(t *testing.T) {
	cases := []struct {
		name string
		// requests are sent together; "close" closes the connection, on
		// the read loop if it is inline, else from its own goroutine once
		// the loop waits (gated: for room, else for the socket).
		requests []string
		gated    bool
		opts     Options
	}{
		{
			name:     "loop waiting for the socket",
			requests: []string{`{"jsonrpc":"2.0","id":1,"method":"close"}`},
		},
		{
			name: "loop waiting for room",
			requests: []string{
				`{"jsonrpc":"2.0","id":1,"method":"close"}`,
				`{"jsonrpc":"2.0","id":2,"method":"block"}`,
				`{"jsonrpc":"2.0","id":3,"method":"echo"}`,
				// At the bound the loop reads on: 3 is held, 4 stops it.
				`{"jsonrpc":"2.0","id":4,"method":"echo"}`,
			},
			gated: true,
			opts:  Options{MaxInflightRequests: 2},
		},
		{
			name:     "inline handler on the loop",
			requests: []string{`{"jsonrpc":"2.0","id":1,"method":"close"}`},
			opts:     Options{Inline: func(m string) bool { return m == "close" }},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			closed := make(chan struct{})
			h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
				switch req.Method {
				case "block":
					<-ctx.Done()
					return nil, ctx.Err()
				case "close":
					if !c.inPlace.Load() {
						t.Error("a connection on a Unix socket is not read in place")
					}
					if tc.opts.Inline != nil {
						c.Close()
						close(closed)
						return nil, nil
					}
					if tc.gated {
						checkFor(t, func() error {
							if !c.readGated.Load() {
								return errors.New("the read loop is not waiting for room")
							}
							return nil
						})
					} else {
						time.Sleep(50 * time.Millisecond) // the loop back in its wait
					}
					c.Close()
					close(closed)
					return nil, nil
				}
				return nil, MethodNotFound(req.Method)
			}}
			tc.opts.InitializeTimeout = -1
			ts := startServer(t, &Server{Options: tc.opts, NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
			c := dial(t, ts.path)
			c.send(tc.requests...)
			testwait.Recv(t, closed)
			for {
				line, err := c.recvErr()
				if err != nil {
					if !errors.Is(err, io.EOF) && !isReset(err) {
						t.Fatalf("after the close: %q, %v; want end of stream", line, err)
					}
					break
				}
			}
			if err := testwait.Recv(t, ts.disconnects); err != nil && !errors.Is(err, ErrClosed) {
				t.Fatalf("Run returned %v", err)
			}
		})
	}
}

// TestSocketSourceReadsOnWhenNothingWouldWakeIt: after a read that
// emptied the socket, the read is tried at once when a frame of that
// read gets no answer or a frame is half read: the bytes or the end of
// stream may have come with it, in the one wake-up the poller gave, and
// no answer read by the peer would wake the poller again.
func TestSocketSourceReadsOnWhenNothingWouldWakeIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*socketSource)
	}{
		{"a frame unanswered", func(s *socketSource) { s.unanswered = true }},
		{"a frame half read", func(s *socketSource) { s.partial = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ours, theirs := socketPair(t)
			var skips atomic.Int64
			s := &socketSource{fd: ours, skips: &skips}
			if _, err := unix.Write(theirs, []byte("abc")); err != nil {
				t.Fatal(err)
			}
			if got, err := readString(t, s, 64); got != "abc" || err != nil {
				t.Fatalf("first read: %q, %v", got, err)
			}
			unix.Shutdown(theirs, unix.SHUT_WR)
			tc.set(s)
			if _, err := readString(t, s, 64); err != io.EOF {
				t.Fatalf("read after the socket was emptied: %v, want io.EOF (the read tried)", err)
			}
			if n := skips.Load(); n != 0 {
				t.Fatalf("%d reads skipped", n)
			}
		})
	}
}

// TestReadInPlaceSkipsTheReadThatFindsNothing: a client that sends each
// request once the answer to the one before has come costs the loop one
// read a request: after each answered request the read that would find
// the socket empty is not tried (fifty-ninth round).
func TestReadInPlaceSkipsTheReadThatFindsNothing(t *testing.T) {
	h := &testHandler{}
	conns := make(chan *Conn, 1)
	ts := startServer(t, &Server{
		Options: Options{InitializeTimeout: -1, Inline: func(m string) bool { return m == "echo" }},
		NewHandler: func(c *Conn, _ Peer) Handler {
			conns <- c
			return h
		},
	}, nil)
	c := dial(t, ts.path)
	const n = 200
	for i := range n {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"echo"}`, i))
		if m := c.recvMsg(); string(m.ID) != fmt.Sprint(i) {
			t.Fatalf("request %d: %v", i, m)
		}
	}
	conn := testwait.Recv(t, conns)
	// The last request's skip comes after its answer is written, and the
	// client may read that answer first: read as it was, the count was
	// one short about one run in a hundred under -race. Waited for; the
	// deadline only stops a loop that never skips.
	for deadline := time.Now().Add(10 * time.Second); conn.readsSkipped.Load() < n && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := conn.readsSkipped.Load(); got < n {
		t.Fatalf("%d reads skipped in %d requests answered one at a time, want one a request", got, n)
	}
}

// TestReadInPlaceSeesAnEndThatCameWithARequestAnsweredLater: a request
// not answered on the read loop (a handler on a goroutine of its own,
// or a deferred one) may be answered much later, or only at the
// connection's end (a read of a hung service). Its frame and the peer's
// close often come in one wake-up of the poller (the client writes and
// closes at once, the loop wakes after both); the read that would find
// the end must then be tried, or the close is seen only once that
// answer is written: the gateway kept such a leaver's connection, and
// all it held, until its request's deadline
// (TestSharedReadsOfAHungService failed one run in about twenty on
// this). Each of the connections writes its request and closes at once.
func TestReadInPlaceSeesAnEndThatCameWithARequestAnsweredLater(t *testing.T) {
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		if req.Method == "hang" {
			<-ctx.Done() // answered only at the connection's end
			return nil, ctx.Err()
		}
		return nil, MethodNotFound(req.Method)
	}}
	ts := startServer(t, &Server{
		Options:    Options{InitializeTimeout: -1},
		NewHandler: func(*Conn, Peer) Handler { return h },
	}, nil)
	const conns = 20
	for i := range conns {
		c := dial(t, ts.path)
		// The loop waits for the socket before the frame comes.
		time.Sleep(5 * time.Millisecond)
		c.send(`{"jsonrpc":"2.0","id":1,"method":"hang"}`)
		c.nc.Close()
		select {
		case err := <-ts.disconnects:
			if err != nil && !errors.Is(err, ErrPeerClosed) && !errors.Is(err, ErrClosed) {
				t.Fatalf("connection %d: Run returned %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("connection %d: its close not seen in 10 s while its request waits for an answer", i)
		}
	}
}
