package jsonrpc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Workers never limit how many handlers run at once: every task that
// blocks still lets the next one start.
func TestWorkersRunEveryTaskAtOnce(t *testing.T) {
	w := newWorkers(4, time.Minute)
	const n = 100
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for range n {
		w.run(func() {
			started.Done()
			<-release
		})
	}
	started.Wait() // would hang if a task waited for another to finish
	close(release)
	w.close()
	if got := w.idle.Load(); got != 0 {
		t.Fatalf("%d workers idle after close", got)
	}
}

// At most maxIdle workers wait for work; the others end with their task.
// Waiting workers are reused, and end after idleFor.
func TestWorkersIdleBoundedAndReused(t *testing.T) {
	w := newWorkers(3, 50*time.Millisecond)
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 10 {
		wg.Add(1)
		w.run(func() { defer wg.Done(); <-release })
	}
	close(release)
	wg.Wait()
	idleIs(t, w, 3)
	// Tasks in a row reuse the waiting workers: no new goroutine.
	before := w.started.Load()
	var ran atomic.Int32
	for range 3 {
		done := make(chan struct{})
		w.run(func() { ran.Add(1); close(done) })
		<-done
	}
	idleIs(t, w, 3)
	if n := w.started.Load() - before; n != 0 {
		t.Fatalf("%d goroutines started for tasks with workers waiting", n)
	}
	// Idle ones end by themselves.
	idleIs(t, w, 0)
	w.close()
	if ran.Load() != 3 {
		t.Fatalf("ran %d tasks", ran.Load())
	}
}

// close waits for the task still running.
func TestWorkersCloseWaitsForRunningTasks(t *testing.T) {
	w := newWorkers(2, time.Minute)
	var finished atomic.Bool
	started := make(chan struct{})
	w.run(func() {
		close(started)
		time.Sleep(30 * time.Millisecond)
		finished.Store(true)
	})
	<-started
	w.close()
	if !finished.Load() {
		t.Fatal("close returned before the running task ended")
	}
}

func idleIs(t *testing.T, w *workers, n int32) {
	t.Helper()
	checkFor(t, func() error {
		if got := w.idle.Load(); got != n {
			return fmt.Errorf("%d idle workers, want %d", got, n)
		}
		return nil
	})
}

// An InlineIdle method is answered on the read loop while the peer waits
// for nothing else (no worker is ever started for one request at a time),
// and on a worker when more requests are already buffered behind it, so
// that a pipelining peer is not held back by it.
func TestInlineIdleOnlyWhenThePeerWaits(t *testing.T) {
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, _ *Conn, req *Request) (any, error) {
		if req.Method == "block" {
			<-release
		}
		return "ok", nil
	})
	srv := &Server{Options: Options{InlineIdle: func(m string) bool { return m == "read" || m == "block" }},
		NewHandler: func(*Conn, Peer) Handler { return h }}
	ts := startServer(t, srv, nil)
	c := dial(t, ts.path)
	for i := range 20 {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"read"}`, i))
		if got := c.recv(); !strings.Contains(got, `"ok"`) {
			t.Fatalf("reply %s", got)
		}
	}
	if n := srv.workers.started.Load(); n != 0 {
		t.Fatalf("%d workers started for requests sent one at a time", n)
	}

	// Pipelined in one write: the blocking one goes to a worker, and the
	// next is answered while it still blocks.
	c.send(`{"jsonrpc":"2.0","id":"b","method":"block"}` + "\n" + `{"jsonrpc":"2.0","id":"r","method":"read"}`)
	if got := c.recv(); !strings.Contains(got, `"id":"r"`) {
		t.Fatalf("first reply %s, want the read's while block waits", got)
	}
	close(release)
	if got := c.recv(); !strings.Contains(got, `"id":"b"`) {
		t.Fatalf("second reply %s", got)
	}
}
