//go:build linux

package jsonrpc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// streamServer serves "stream": notifications of 4 KiB until the
// connection closes.
func streamServer(t *testing.T, stall time.Duration) *testServer {
	t.Helper()
	chunk := map[string]string{"text": strings.Repeat("z", 4096)}
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		for {
			if err := c.Notify(ctx, "session/update", chunk); err != nil {
				return nil, err
			}
		}
	}}
	return startServer(t, &Server{
		Options:    Options{WriteStallTimeout: stall, MaxPendingBytes: 1 << 20},
		NewHandler: func(*Conn, Peer) Handler { return h },
	}, nil)
}

// readBytes reads n bytes from the client's socket.
func (c *client) readBytes(n int) {
	c.t.Helper()
	buf := make([]byte, 16<<10)
	for n > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(waitFor))
		m, err := c.nc.Read(buf[:min(n, len(buf))])
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		n -= m
	}
}

// The write-stall rule is functional, so these bounds are part of its
// contract (a stalled peer is cut within limit + 1 s of its last read),
// not a performance measure; the windows are a second wide.

// TestWriteStallNeverRead: a peer that never reads is cut within
// [limit, limit+1s] of the moment output began: the bytes the kernel took
// into its buffer at the start do not count as the peer's progress (they
// did, and the cut came at twice the limit).
func TestWriteStallNeverRead(t *testing.T) {
	const stall = 2 * time.Second
	ts := streamServer(t, stall)
	c := dial(t, ts.path)
	start := time.Now()
	c.send(`{"jsonrpc":"2.0","id":1,"method":"stream"}`)
	err := testwait.Recv(t, ts.disconnects)
	took := time.Since(start)
	if !errors.Is(err, ErrWriteStall) {
		t.Fatalf("Run returned %v, want ErrWriteStall", err)
	}
	t.Logf("cut %v after the request (limit %v)", took, stall)
	if took < stall || took > stall+time.Second {
		t.Fatalf("cut %v after output began, want within [%v, %v]", took, stall, stall+time.Second)
	}
}

// TestWriteStallAfterReading: a peer that reads for a while, then stops,
// is cut within [limit, limit+1s] of its last read.
func TestWriteStallAfterReading(t *testing.T) {
	const stall = 2 * time.Second
	ts := streamServer(t, stall)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"stream"}`)
	for i := 0; i < 3; i++ {
		if i > 0 {
			time.Sleep(stall / 4) // a slow reader; the waiting is the behaviour
		}
		c.readBytes(64 << 10)
	}
	last := time.Now()
	err := testwait.Recv(t, ts.disconnects)
	took := time.Since(last)
	if !errors.Is(err, ErrWriteStall) {
		t.Fatalf("Run returned %v, want ErrWriteStall", err)
	}
	t.Logf("cut %v after the last read (limit %v)", took, stall)
	// The server may see the read a hair before the reader's clock does.
	if took < stall-100*time.Millisecond || took > stall+time.Second {
		t.Fatalf("cut %v after the last read, want within [%v, %v]", took, stall, stall+time.Second)
	}
}

// TestWriteStallSlowReader: a peer taking 64 KiB every 0.6 × limit is
// never cut, over several limits.
func TestWriteStallSlowReader(t *testing.T) {
	const stall = time.Second
	ts := streamServer(t, stall)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"stream"}`)
	for end := time.Now().Add(5 * stall); time.Now().Before(end); {
		time.Sleep(stall * 6 / 10) // the pace of a slow reader
		c.readBytes(64 << 10)
		select {
		case err := <-ts.disconnects:
			t.Fatalf("a reader taking 64 KiB every %v was cut: %v", stall*6/10, err)
		default:
		}
	}
	c.nc.Close()
	if err := testwait.Recv(t, ts.disconnects); errors.Is(err, ErrWriteStall) {
		t.Fatalf("Run returned %v after the peer hung up", err)
	}
}
