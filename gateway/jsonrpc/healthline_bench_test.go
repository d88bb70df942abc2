package jsonrpc

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/internal/padecho"
)

// BenchmarkHealthLine is one client sending health's request line, one at
// a time, to a connection that answers it inline with a 900-byte encoded
// result, as the gateway answers health; BenchmarkHealthLineEcho is the
// same client against the e2e same-size echo's loop (padecho.Serve:
// bufio, ReadBytes, the reply padded to 937 bytes) in this process. With one client and
// both ends in one process they are what valgrind's callgrind counts by
// instruction (GODEBUG=asyncpreemptoff=1, -benchtime Nx): the two totals
// differ by what the read loop does a request that the echo does not,
// the client's share being the same (docs/performance.md, sixty-sixth
// round).
func BenchmarkHealthLine(b *testing.B) {
	answer := any(EncodedJSON(`{"x":"` + string(bytes.Repeat([]byte("a"), 880)) + `"}`))
	ts := startServer(b, &Server{
		Options: Options{InitializeTimeout: -1, Inline: func(m string) bool { return m == "health" }},
		NewHandler: func(*Conn, Peer) Handler {
			return HandlerFunc(func(context.Context, *Conn, *Request) (any, error) { return answer, nil })
		},
	}, nil)
	sendHealthLines(b, ts.path)
}

// BenchmarkHealthLineEcho: see BenchmarkHealthLine.
func BenchmarkHealthLineEcho(b *testing.B) {
	path := socketPath(b)
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	const replyBytes = 937
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		padecho.Serve(c, replyBytes)
	}()
	sendHealthLines(b, path)
}

// sendHealthLines is both benchmarks' client: health's request line sent
// on a connection to path, each reply read to its LF before the next.
func sendHealthLines(b *testing.B, path string) {
	nc, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	line := []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":1}` + "\n")
	buf := make([]byte, 4096)
	for b.Loop() {
		if _, err := nc.Write(line); err != nil {
			b.Fatal(err)
		}
		got := 0
		for got == 0 || buf[got-1] != '\n' {
			n, err := nc.Read(buf[got:])
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
}

// BenchmarkClassifyHealthLine is the read loop's classification of
// health's request line alone, as serveFrames makes it: into the
// connection's Request, the method's name from the connection's names,
// nothing allocated. Its instructions an operation (callgrind, the
// difference of two -benchtime Nx runs) are the frame's check and its
// envelope without the socket's noise around them.
func BenchmarkClassifyHealthLine(b *testing.B) {
	frame := []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":1}`)
	var names methodNames
	var into Request
	b.ReportAllocs()
	for b.Loop() {
		if m := classifyInto(frame, &names, &into); m.Kind != KindRequest {
			b.Fatal(m.Problem)
		}
	}
}
