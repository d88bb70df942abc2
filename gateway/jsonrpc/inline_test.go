package jsonrpc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// inPlaceHandler serves "look" inline: its answer says whether the
// request's params lie in the connection's read buffer (read where they
// came, not copied).
type inPlaceHandler struct{}

func (inPlaceHandler) Handle(_ context.Context, c *Conn, req *Request) (any, error) {
	buf := c.fr.buf
	if len(req.Params) == 0 || len(buf) == 0 {
		return false, nil
	}
	for i := range buf {
		if &buf[i] == &req.Params[0] {
			return string(buf[i:i+len(req.Params)]) == `{"x":"abc"}`, nil
		}
	}
	return false, nil
}

// TestInlineRequestReadInPlace: a request handled on the read loop is
// read where it came, in the reader's buffer: nothing reads that buffer
// again before its handler returns, so the frame is not copied (health,
// tens of thousands a second, paid a copy each; docs/performance.md,
// sixtieth and sixty-first rounds).
func TestInlineRequestReadInPlace(t *testing.T) {
	ts := startServer(t, &Server{
		Options:    Options{InitializeTimeout: -1, Inline: func(m string) bool { return m == "look" }},
		NewHandler: func(*Conn, Peer) Handler { return inPlaceHandler{} },
	}, nil)
	c := dial(t, ts.path)
	for i := range 3 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"look","params":{"x":"abc"}}`, i))
		if m := c.recvMsg(); m.Error != nil || string(m.Result) != "true" {
			t.Fatalf("request %d: %s; want its params read in the read buffer (true)", i, m)
		}
	}
}

// keepHandler: "keep" (on its own goroutine) and "ask" (which calls the
// peer) hold what they got until released, then answer it; "inline"
// echoes its params on the read loop.
type keepHandler struct {
	started chan struct{}
	release chan struct{}
}

func (h *keepHandler) Handle(ctx context.Context, c *Conn, req *Request) (any, error) {
	switch req.Method {
	case "inline":
		return req.Params, nil
	case "keep":
		kept := req.Params
		h.started <- struct{}{}
		<-h.release
		return kept, nil
	case "ask":
		got, err := c.Call(ctx, "q", nil)
		if err != nil {
			return nil, err
		}
		h.started <- struct{}{}
		<-h.release
		return got, nil
	}
	return nil, MethodNotFound(req.Method)
}

// TestKeptFramesOutliveTheFramesAfterThem: what outlives the read of the
// next frame is copied out of the read buffer, which the next frames are
// read into: the params of a request handled on its own goroutine, and
// the result of a response to a call. Each is held while inline requests
// longer than it are read where it came and answered, then given back:
// it must come back as it was sent. Read in place, as inline requests
// are, each would come back as the inline requests' bytes.
func TestKeptFramesOutliveTheFramesAfterThem(t *testing.T) {
	h := &keepHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	ts := startServer(t, &Server{
		Options:    Options{InitializeTimeout: -1, Inline: func(m string) bool { return m == "inline" }},
		NewHandler: func(*Conn, Peer) Handler { return h },
	}, nil)
	kept := `{"v":"` + strings.Repeat("k", 40) + `"}`
	overwrite := func(c *client) {
		t.Helper()
		testwait.Recv(t, h.started)
		params := `{"v":"` + strings.Repeat("o", 200) + `"}`
		for i := range 3 {
			c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":"in-%d-%s","method":"inline","params":%s}`, i, strings.Repeat("i", 30), params))
			if m := c.recvMsg(); string(m.Result) != params || string(m.ID) != fmt.Sprintf(`"in-%d-%s"`, i, strings.Repeat("i", 30)) {
				t.Fatalf("inline request %d answered %s", i, m)
			}
		}
		h.release <- struct{}{}
	}

	t.Run("params", func(t *testing.T) {
		// Its id too is answered after the inline requests were read
		// where it came (a string, then a number).
		for _, id := range []string{`"keep-12345"`, `1234567890`} {
			c := dial(t, ts.path)
			c.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"keep","params":` + kept + `}`)
			overwrite(c)
			if m := c.recvMsg(); string(m.Result) != kept || string(m.ID) != id {
				t.Fatalf("the kept request came back as %s, want id %s and result %s", m, id, kept)
			}
		}
	})
	t.Run("call result", func(t *testing.T) {
		c := dial(t, ts.path)
		c.send(`{"jsonrpc":"2.0","id":1,"method":"ask"}`)
		q := c.recvMsg()
		if q.Method != "q" {
			t.Fatalf("got %s, want the call q", q)
		}
		c.send(`{"jsonrpc":"2.0","id":` + string(q.ID) + `,"result":` + kept + `}`)
		overwrite(c)
		if m := c.recvMsg(); string(m.Result) != kept {
			t.Fatalf("the call's result came back as %s, want result %s", m, kept)
		}
	})
}

// TestInlineRequestAllocations counts what a request handled on the read
// loop allocates in the whole round trip, client included (which
// allocates nothing: a fixed line written, the reply read into a fixed
// buffer): nothing. Its Request is the connection's own, and nothing is
// made for its frame or its method's name (three allocations before the
// sixty-first round, one, the Request, before the sixty-second).
func TestInlineRequestAllocations(t *testing.T) {
	nc := dialInlineHealth(t)
	line := []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":1}` + "\n")
	want := []byte(`{"jsonrpc":"2.0","id":1,"result":{"status":"ok"}}` + "\n")
	buf := make([]byte, 256)
	roundTrip := func() {
		inlineRoundTrip(t, nc, buf, line, want)
	}
	roundTrip() // the connection's buffers made
	n := testing.AllocsPerRun(200, roundTrip)
	t.Logf("%v allocations a round trip", n)
	if n > maxInlineAllocs {
		t.Fatalf("an inline request's round trip allocates %v objects, want at most %d", n, maxInlineAllocs)
	}
}

// dialInlineHealth starts a server whose "health" is inline and answers
// one encoded result, and dials it: the connection the allocation tests
// count round trips on.
func dialInlineHealth(t *testing.T) net.Conn {
	t.Helper()
	answer := any(EncodedJSON(`{"status":"ok"}`))
	ts := startServer(t, &Server{
		Options: Options{InitializeTimeout: -1, Inline: func(m string) bool { return m == "health" }},
		NewHandler: func(*Conn, Peer) Handler {
			return HandlerFunc(func(context.Context, *Conn, *Request) (any, error) { return answer, nil })
		},
	}, nil)
	nc, err := net.Dial("unix", ts.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// inlineRoundTrip writes line on nc and reads its one reply into buf,
// which must be want; it allocates nothing itself.
func inlineRoundTrip(t *testing.T, nc net.Conn, buf, line, want []byte) {
	t.Helper()
	if _, err := nc.Write(line); err != nil {
		t.Fatal(err)
	}
	n := 0
	for n == 0 || buf[n-1] != '\n' {
		m, err := nc.Read(buf[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += m
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("reply %q, want %q", buf[:n], want)
	}
}

// maxInlineAllocs: nothing.
const maxInlineAllocs = 0

// TestInlineRequestIDsAllocateNothing: an inline request's id, a number
// of several digits or a string, different in each request as a
// client's ids are, is answered from the frame it came in, with no
// string made for it (a round trip allocated two objects a request, its
// Request and its id's text, before the sixty-second round). An escaped
// string id is decoded into a string of its own, as before, and answered
// as written.
func TestInlineRequestIDsAllocateNothing(t *testing.T) {
	nc := dialInlineHealth(t)
	const rounds = 64
	var lines, wants [][]byte
	for i := range rounds {
		id := strconv.Itoa(1_000_000_007 + 7919*i)
		if i%2 == 1 {
			id = `"req-` + id + `"`
		}
		lines = append(lines, []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":`+id+"}\n"))
		wants = append(wants, []byte(`{"jsonrpc":"2.0","id":`+id+`,"result":{"status":"ok"}}`+"\n"))
	}
	buf := make([]byte, 256)
	next := 0
	roundTrip := func() {
		i := next % rounds
		next++
		inlineRoundTrip(t, nc, buf, lines[i], wants[i])
	}
	roundTrip() // the connection's buffers made
	n := testing.AllocsPerRun(4*rounds, roundTrip)
	t.Logf("%v allocations a round trip", n)
	if n > 0 {
		t.Fatalf("an inline request's round trip with its own id allocates %v objects, want none", n)
	}

	// Escaped, and the same bytes unescaped after it: each answered as
	// it was written.
	for _, id := range []string{`"r\u0065q-1"`, `"req-1"`, `"\ud800"`, `-0.5e3`} {
		line := []byte(`{"jsonrpc":"2.0","method":"health","id":` + id + "}\n")
		want := []byte(`{"jsonrpc":"2.0","id":` + id + `,"result":{"status":"ok"}}` + "\n")
		inlineRoundTrip(t, nc, buf, line, want)
	}
}

// TestClassifyKnownMethodAllocatesNoName: a connection's method names
// are kept, and a request of one allocates no string for it: two
// allocations (the request, the number id's text) where Classify makes
// three.
func TestClassifyKnownMethodAllocatesNoName(t *testing.T) {
	frame := []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":12345}`)
	var names methodNames
	classify(frame, &names)
	n := testing.AllocsPerRun(100, func() {
		m := classify(frame, &names)
		if m.Kind != KindRequest || m.Request.Method != "health" || m.Request.ID.String() != "12345" {
			t.Fatalf("classified %+v", m)
		}
	})
	if n > 2 {
		t.Fatalf("a request of a known method allocates %v objects, want at most 2", n)
	}
}

// TestMethodNamesKeepOnlyNamesAsWritten: a name written with an escape
// or with bytes that are not UTF-8 decodes as Classify decodes it, is
// never kept (its bytes are not its name), and a later request with
// other bytes gets its own name, not a kept one; a ninth name replaces
// the oldest.
func TestMethodNamesKeepOnlyNamesAsWritten(t *testing.T) {
	var names methodNames
	for _, c := range []struct{ raw, want string }{
		{`"health"`, "health"},
		{`"health"`, "health"},
		{`"he\u0061lth"`, "health"},
		{`"a\nb"`, "a\nb"},
		{"\"x\xffy\"", "x\uFFFDy"},
		{"\"x\xffy\"", "x\uFFFDy"},
		{`"x\ufffdy"`, "x\uFFFDy"},
		{`"healt"`, "healt"},
		{`""`, ""},
	} {
		got, ok := names.name([]byte(c.raw))
		if !ok || got != c.want {
			t.Fatalf("name(%s) = %q, %v; want %q", c.raw, got, ok, c.want)
		}
	}
	for _, s := range names.names {
		if s != "" && s != "health" && s != "healt" {
			t.Fatalf("kept %q, a name not written as it is", s)
		}
	}
	for i := range len(names.names) {
		names.name(fmt.Appendf(nil, `"m%d"`, i))
	}
	for _, s := range names.names {
		if s == "health" {
			t.Fatal("health still kept after eight names since")
		}
	}
	if got, _ := names.name([]byte(`"m7"`)); got != "m7" {
		t.Fatalf("m7 read as %q", got)
	}
}
