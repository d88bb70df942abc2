package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
)

// SendAll writes its frames in order and together: frames another
// goroutine sends at the same time never come between them, whether the
// batch is written directly or queued for the writer (net.Pipe blocks
// every write until it is read, so both paths are taken).
func TestSendAllKeepsBatchesWholeAndInOrder(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	c, ctx := runConn(t, server)

	const batches, size, singles = 200, 5, 500
	encode := func(method string, params ...int) Notification {
		raw, _ := json.Marshal(params)
		n, err := EncodeNotification(method, json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var senders sync.WaitGroup
	senders.Add(2)
	go func() {
		defer senders.Done()
		for k := range batches {
			ns := make([]Notification, size)
			for j := range ns {
				ns[j] = encode("a", k, j)
			}
			if err := c.SendAll(ctx, ns); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer senders.Done()
		for k := range singles {
			if err := c.SendAll(ctx, []Notification{encode("b", k)}); err != nil {
				t.Error(err)
				return
			}
		}
	}()

	r := bufio.NewReader(client)
	nextA, nextB := 0, 0 // frames of each kind seen
	for nextA < batches*size || nextB < singles {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("after %d a and %d b frames: %v", nextA, nextB, err)
		}
		var f struct {
			Method string `json:"method"`
			Params []int  `json:"params"`
		}
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatalf("frame %q: %v", line, err)
		}
		switch f.Method {
		case "a":
			if want := []int{nextA / size, nextA % size}; fmt.Sprint(f.Params) != fmt.Sprint(want) {
				t.Fatalf("a frame %v, want %v", f.Params, want)
			}
			nextA++
		case "b":
			if nextA%size != 0 {
				t.Fatalf("b frame %v inside batch %d", f.Params, nextA/size)
			}
			if f.Params[0] != nextB {
				t.Fatalf("b frame %v, want %d", f.Params, nextB)
			}
			nextB++
		default:
			t.Fatalf("frame %q", line)
		}
	}
	senders.Wait()
	if err := c.SendAll(ctx, nil); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
	if err := c.SendAll(ctx, []Notification{{}}); err == nil {
		t.Fatal("an empty notification was sent")
	}
}

// TrySend writes at once while the output is idle and never blocks: a
// frame larger than the socket's buffer, to a peer that reads nothing, is
// written in part and the rest queued; while that is pending, TrySend
// sends nothing and says so, and what is sent next (SendAll) goes after
// the whole frame. A connection that cannot write without waiting
// (net.Pipe) always says no.
func TestTrySend(t *testing.T) {
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c, ctx := runConn(t, server)

	note := func(text string) Notification {
		raw, _ := json.Marshal([]string{text})
		n, err := EncodeNotification("n", json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	r := bufio.NewReader(client)
	read := func() string {
		t.Helper()
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var f struct{ Params []string }
		if err := json.Unmarshal(line, &f); err != nil || len(f.Params) != 1 {
			t.Fatalf("frame %.80q: %v", line, err)
		}
		return f.Params[0]
	}

	if !c.TrySend(note("one")) {
		t.Fatal("not sent on an idle connection")
	}
	if got := read(); got != "one" {
		t.Fatalf("read %q", got)
	}

	big := strings.Repeat("x", 8<<20) // past any Unix socket buffer
	if !c.TrySend(note(big)) {
		t.Fatal("not sent on an idle connection")
	}
	if c.TrySend(note("skipped")) {
		t.Fatal("sent while a frame was still pending")
	}
	if err := c.SendAll(ctx, []Notification{note("two")}); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != big {
		t.Fatalf("read %d bytes, want the %d of the big frame", len(got), len(big))
	}
	if got := read(); got != "two" {
		t.Fatalf("read %q after the big frame, want two", got)
	}

	p1, p2 := net.Pipe()
	defer p2.Close()
	if NewConn(p1, nil, Options{}).TrySend(note("pipe")) {
		t.Fatal("sent over a connection that cannot write without waiting")
	}
}

// runConn runs a Conn without a handler on nc until the test ends.
func runConn(t *testing.T, nc net.Conn) (*Conn, context.Context) {
	c := NewConn(nc, nil, Options{InitializeTimeout: -1})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = c.Run(ctx) }()
	t.Cleanup(func() { c.Close(); <-ran; cancel() })
	return c, ctx
}

// EncodeRawNotification gives EncodeNotification's frame, or its error,
// for the same params.
func TestEncodeRawNotificationAsEncodeNotification(t *testing.T) {
	for _, tc := range []struct{ method, params string }{
		{"session/update", `{"sessionId":"s_1","text":"1796357943194065258 ","type":"agent_message_chunk"}`},
		{"session/update", `{"text":"caf\u00e9 \"quoted\" \\u2028 line\\nbreak"}`},
		{"session/update", `[1,2,{"a":null}]`},
		{"session/update", `"a string"`},
		{"m", `{ "spaced" : [ 1 , 2 ] }`}, // valid, not compact: marshalled compact
		{"m", "{\"a\":\n1}"},              // an LF: marshalled without it
		{`quote"and\back`, `{"a":1}`},     // a method that needs escapes
		{"m", `{"a":`},                    // invalid
		{"m", `{"a":1} {"b":2}`},          // two values
		{"m", ""},                         // empty
	} {
		want, wantErr := EncodeNotification(tc.method, json.RawMessage(tc.params))
		got, err := EncodeRawNotification(tc.method, json.RawMessage(tc.params))
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%q %q: error %v, EncodeNotification's %v", tc.method, tc.params, err, wantErr)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidFrame) {
				t.Errorf("%q %q: error %v is not ErrInvalidFrame", tc.method, tc.params, err)
			}
			continue
		}
		frame := got.appendTo(nil)
		if wantFrame := want.appendTo(nil); string(frame) != string(wantFrame) {
			t.Errorf("%q %q:\n got %s\nwant %s", tc.method, tc.params, frame, wantFrame)
		}
		var f struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(frame, &f); err != nil || f.Method != tc.method {
			t.Errorf("%q %q: frame %s does not decode: %v", tc.method, tc.params, frame, err)
		}
	}
}

// A notification's Len is the length of the frame it sends (the outbox
// sizes its batches by it, SendAll its buffer), with or without params
// and whatever its method's escapes.
func TestNotificationLenIsItsFrame(t *testing.T) {
	for _, tc := range []struct {
		method string
		params any
	}{
		{"session/update", json.RawMessage(`{"sessionId":"s_1","text":"x"}`)},
		{"session/update", nil},
		{`quote"and\back`, nil},
		{"<&>", map[string]int{"a": 1}},
		{"caf\u00e9 \u2028 \xff", []int{1, 2}},
		{"", "only a string"},
	} {
		n, err := EncodeNotification(tc.method, tc.params)
		if err != nil {
			t.Fatalf("%q: %v", tc.method, err)
		}
		frame := n.appendTo(nil)
		if n.Len() != len(frame) {
			t.Errorf("%q %v: Len %d, frame %d bytes: %s", tc.method, tc.params, n.Len(), len(frame), frame)
		}
		var f struct {
			Method string `json:"method"`
		}
		if err := json.Unmarshal(frame, &f); err != nil || f.Method != strings.ToValidUTF8(tc.method, "\ufffd") {
			t.Errorf("%q: frame %s does not decode to its method: %v", tc.method, frame, err)
		}
	}
}

// BenchmarkEncodeUpdate encodes a streamed chunk's session update as the
// fan-out does and builds its frame as a connection's send does, in the
// send's reused buffer: the params are the bus message's own bytes
// (bus.Update), checked once, kept in the Notification and copied once a
// connection, straight into what is written. allocs/op and B/op are the
// garbage each update leaves in the gateway. (Before 3689b5f the params
// came as a string, converted to a json.RawMessage and boxed in an
// interface, and the frame grew from nothing: 702 ns, 712 B and 6
// allocations for the encoding alone; from 3689b5f to the thirty-second
// round the frame was built in an allocation of its exact size and
// copied again by every send: 334 ns, 320 B and 1 allocation.)
func BenchmarkEncodeUpdate(b *testing.B) {
	params := []byte(`{"content":{"text":"1796357943194065258 ","type":"text"},"session_id":"s_0123456789abcdef01234567","sessionId":"s_0123456789abcdef01234567","sessionUpdate":"agent_message_chunk","turn_id":"t_0123456789abcdef01234567","type":"agent_message_chunk"}`)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		n, err := EncodeRawNotification("session/update", params)
		if err != nil {
			b.Fatal(err)
		}
		buf = append(n.appendTo(buf[:0]), '\n')
		if len(buf) != n.Len()+1 {
			b.Fatal(len(buf), n.Len())
		}
	}
}
