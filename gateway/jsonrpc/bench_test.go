package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/countio"
)

// BenchmarkRoundTrip measures closed-loop request/response over a Unix
// socket, 1 and 64 concurrent clients each with its own connection: first
// a raw NDJSON echo server (the baseline: read a line, write it back),
// then a Conn serving a trivial method, on a goroutine of its own and
// inline. Both run in the same benchmark
// run, so their ratio is meaningful on any machine. Reported: req/s and
// p50/p99 latency in µs.
func BenchmarkRoundTrip(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("echo/clients=%d", clients), func(b *testing.B) {
			runLoad(b, startEcho(b), clients)
		})
		b.Run(fmt.Sprintf("conn/clients=%d", clients), func(b *testing.B) {
			srv := &Server{
				Options: Options{InitializeTimeout: -1, Logger: zap.NewNop()},
				NewHandler: func(*Conn, Peer) Handler {
					return HandlerFunc(func(_ context.Context, _ *Conn, req *Request) (any, error) {
						return req.Params, nil
					})
				},
			}
			runLoad(b, startServer(b, srv, nil).path, clients)
		})
		// inline: the same method handled on the read loop, as health
		// and initialize are (Options.Inline), its answer built once:
		// what the loop itself costs a request, allocations included.
		b.Run(fmt.Sprintf("inline/clients=%d", clients), func(b *testing.B) {
			answer := any(EncodedJSON(`{"session_id":"s-1","text":"hello"}`))
			srv := &Server{
				Options: Options{InitializeTimeout: -1, Logger: zap.NewNop(),
					Inline: func(m string) bool { return m == "echo" }},
				NewHandler: func(*Conn, Peer) Handler {
					return HandlerFunc(func(context.Context, *Conn, *Request) (any, error) { return answer, nil })
				},
			}
			runLoad(b, startServer(b, srv, nil).path, clients)
		})
	}
}

// startEcho serves the baseline: every line is written back as it came,
// flushed when no more input is buffered.
func startEcho(b *testing.B) string {
	path := socketPath(b)
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				r, w := bufio.NewReaderSize(nc, 64<<10), bufio.NewWriterSize(nc, 64<<10)
				for {
					line, err := r.ReadSlice('\n')
					if err != nil {
						return
					}
					w.Write(line)
					if r.Buffered() == 0 && w.Flush() != nil {
						return
					}
				}
			}()
		}
	}()
	return path
}

var benchRequest = []byte(`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"session_id":"s-1","text":"hello"}}` + "\n")

// runLoad runs b.N round trips spread over clients connections.
func runLoad(b *testing.B, path string, clients int) {
	conns := make([]net.Conn, clients)
	for i := range conns {
		nc, err := net.Dial("unix", path)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i, nc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := bufio.NewReader(nc)
			samples := make([]time.Duration, 0, b.N/clients+1)
			for left.Add(-1) >= 0 {
				t0 := time.Now()
				if _, err := nc.Write(benchRequest); err != nil {
					b.Error(err)
					return
				}
				if _, err := r.ReadSlice('\n'); err != nil {
					b.Error(err)
					return
				}
				samples = append(samples, time.Since(t0))
			}
			lat[i] = samples
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(float64(len(all))*p))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkNotifyWriter: notifications queued with Notify, which the
// writer goroutine writes, each to an idle socket whose reader takes it
// before the next is queued: one writeAll of one frame each, under the
// write-stall rule (its default limit), the path of queued output (a
// streamed update that finds the output busy, a reply behind others).
// Reported per notification: the queueing, the hand-off and the write.
func BenchmarkNotifyWriter(b *testing.B) {
	client, server := unixPair(b)
	conn := NewConn(server, nil, Options{InitializeTimeout: -1, Logger: zap.NewNop()})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = conn.Run(ctx)
	}()
	read := countio.Start(client)
	params := json.RawMessage(`{"content":{"text":"1796357943194065258 ","type":"text"},"sessionId":"s_0123456789abcdef01234567","sessionUpdate":"agent_message_chunk"}`)
	n, err := EncodeNotification("session/update", params)
	if err != nil {
		b.Fatal(err)
	}
	frame := int64(n.Len() + 1)
	var sent int64
	b.ReportAllocs()
	for b.Loop() {
		if err := conn.Notify(ctx, "session/update", params); err != nil {
			b.Fatal(err)
		}
		sent++
		if !read.WaitFor(sent*frame, conn.Done()) {
			b.Fatalf("the connection or its reader ended after %d of %d bytes were read", read.N(), sent*frame)
		}
	}
	b.StopTimer()
	conn.Close()
	cancel()
	<-ran
	client.Close()
	read.Wait()
}

// BenchmarkWriteAll: writeAll alone, one update's frame at a time to a
// socket with room (a reader drains it), under the write-stall rule: what
// the rule costs a write that does not wait, the path of every write the
// writer goroutine makes.
func BenchmarkWriteAll(b *testing.B) {
	client, server := unixPair(b)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, client)
	}()
	c := NewConn(server, nil, Options{InitializeTimeout: -1, Logger: zap.NewNop()})
	frame := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"content":{"text":"1796357943194065258 ","type":"text"},"sessionId":"s_0123456789abcdef01234567","sessionUpdate":"agent_message_chunk"}}` + "\n")
	b.ReportAllocs()
	for b.Loop() {
		if err := c.writeAll(frame, false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	server.Close()
	<-drained
}

// unixPair is a connected pair of Unix sockets (a listener's, so the
// server side is a *net.UnixConn as the gateway's are), both closed at
// the end of tb.
func unixPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("unix", socketPath(tb))
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("unix", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { server.Close() })
	return client, server
}
