//go:build linux

package jsonrpc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// streamServer serves "stream": notifications of 4 KiB until the
// connection closes.
func streamServer(t *testing.T, stall time.Duration) *testServer {
	t.Helper()
	return streamServerFirst(t, stall, 4096)
}

// streamServerFirst is streamServer with a first notification of first
// bytes of text.
func streamServerFirst(t *testing.T, stall time.Duration, first int) *testServer {
	t.Helper()
	head := map[string]string{"text": strings.Repeat("z", first)}
	chunk := map[string]string{"text": strings.Repeat("z", 4096)}
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		if err := c.Notify(ctx, "session/update", head); err != nil {
			return nil, err
		}
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

// awaitOutput waits until output has reached the client's socket, reading
// none of it (a read would be progress), and returns when it saw it.
func (c *client) awaitOutput() time.Time {
	c.t.Helper()
	raw, err := c.nc.SyscallConn()
	if err != nil {
		c.t.Fatal(err)
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(waitFor))
	var ioctlErr error
	err = raw.Read(func(fd uintptr) bool {
		var n int
		n, ioctlErr = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		return ioctlErr != nil || n > 0 // false: wait until readable
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		c.t.Fatalf("waiting for output: %v", err)
	}
	return time.Now()
}

// TestWriteStallNeverRead: a peer that never reads is cut within
// [limit, limit+1s] of the moment its output began to wait: the bytes the
// kernel took into its buffer at the start do not count as the peer's
// progress (they did, and the cut came at twice the limit).
//
// Output waits from the first notification on, which is larger than the
// socket's buffer, so the first write already blocks. The window's end
// runs from the moment the output reached the peer's socket, not from the
// request: the server's time to read the request, start the handler and
// encode its first notification is not the rule's, and on a loaded
// machine it took a third of the window. The rule starts its clock when a
// write blocks: with 4 KiB notifications under load, filling the buffer
// took up to a second before the clock could start (the sixty-second and
// sixty-third rounds, docs/testing.md).
func TestWriteStallNeverRead(t *testing.T) {
	const stall = 2 * time.Second
	ts := streamServerFirst(t, stall, 512<<10)
	c := dial(t, ts.path)
	start := time.Now()
	c.send(`{"jsonrpc":"2.0","id":1,"method":"stream"}`)
	began := c.awaitOutput()
	err := testwait.Recv(t, ts.disconnects)
	end := time.Now()
	if !errors.Is(err, ErrWriteStall) {
		t.Fatalf("Run returned %v, want ErrWriteStall", err)
	}
	t.Logf("cut %v after the request, %v after output reached the peer (limit %v)", end.Sub(start), end.Sub(began), stall)
	if took := end.Sub(start); took < stall {
		t.Fatalf("cut %v after the request, want %v at least", took, stall)
	}
	if took := end.Sub(began); took > stall+time.Second {
		t.Fatalf("cut %v after output began, want %v at most", took, stall+time.Second)
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

// TestWriteStallSlowFill: output that trickles in fills the socket's
// buffer of a peer that never reads, and the peer is cut within
// [limit, limit+tick] of the moment a write first blocked, not a tick
// after it (the cut came at limit + tick: the clock started at the first
// sample, taken when a write had been blocked for a tick).
//
// The moment a write first blocked is bounded from below without looking
// into the writer: it was the write of the first notification that did
// not reach the peer whole, which cannot have begun before that
// notification was queued. The handler notes when it queues each one;
// the peer, after the cut, reads what it was sent and counts the whole
// lines.
func TestWriteStallSlowFill(t *testing.T) {
	const (
		stall = 4 * time.Second
		pace  = 10 * time.Millisecond // about 40 notifications a buffer: half a second of filling at least
		noted = 4096                  // more than the buffer and the 1 MiB queue hold together
	)
	tick := stallTick(stall)
	var (
		mu     sync.Mutex
		queued []time.Time // when notification i was queued
		cut    = make(chan time.Time, 1)
	)
	chunk := map[string]string{"text": strings.Repeat("z", 4096)}
	h := &testHandler{onCall: func(ctx context.Context, c *Conn, req *Request) (any, error) {
		for {
			mu.Lock()
			if len(queued) < noted {
				queued = append(queued, time.Now())
			}
			mu.Unlock()
			if err := c.Notify(ctx, "session/update", chunk); err != nil {
				return nil, err
			}
			time.Sleep(pace) // output that trickles in; the waiting is the case
		}
	}}
	ts := startServer(t, &Server{
		Options:      Options{WriteStallTimeout: stall, MaxPendingBytes: 1 << 20},
		NewHandler:   func(*Conn, Peer) Handler { return h },
		OnDisconnect: func(*Conn, Peer, error) { cut <- time.Now() },
	}, nil)
	c := dial(t, ts.path)
	c.send(`{"jsonrpc":"2.0","id":1,"method":"stream"}`)
	err := testwait.Recv(t, ts.disconnects)
	end := testwait.Recv(t, cut)
	if !errors.Is(err, ErrWriteStall) {
		t.Fatalf("Run returned %v, want ErrWriteStall", err)
	}
	lines := 0
	for {
		if _, err := c.recvErr(); err != nil {
			break // what the peer was sent, read after the cut, then the end
		}
		lines++
	}
	mu.Lock()
	defer mu.Unlock()
	if lines >= len(queued) {
		t.Fatalf("the peer got %d whole notifications of the %d queued: no write blocked", lines, len(queued))
	}
	began := queued[lines]
	t.Logf("cut %v after the first write that blocked was queued, notification %d (%v after the first; limit %v, tick %v)",
		end.Sub(began), lines, began.Sub(queued[0]), stall, tick)
	if took := end.Sub(began); took > stall+tick {
		t.Fatalf("cut %v after output first waited, want %v (limit + tick) at most", took, stall+tick)
	}
}
