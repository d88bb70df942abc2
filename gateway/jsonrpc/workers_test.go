package jsonrpc

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
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
		testwait.Recv(t, done)
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
	testwait.Recv(t, started)
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
