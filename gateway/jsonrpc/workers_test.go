package jsonrpc

import (
	"fmt"
	"strings"
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
// Waiting workers are reused: no goroutine starts for a task while one
// waits. The test hands the tasks once the workers wait in their select:
// a worker counts itself idle before it gets there, and a loaded machine
// may not run it for a while, so a task handed on the count alone found
// no worker taking it and started a goroutine (4 of 350 runs under
// -race at a load of 30). They wait a minute here, not 50 ms, for the
// same reason: a test descheduled for 50 ms found them gone. That they
// end after idleFor is TestWorkersIdleEndByThemselves.
func TestWorkersIdleBoundedAndReused(t *testing.T) {
	w := newWorkers(3, time.Minute)
	defer w.close()
	finishTen(t, w)
	waitingIs(t, w, 3)
	// Tasks in a row reuse the waiting workers: no new goroutine.
	before := w.started.Load()
	var ran atomic.Int32
	for range 3 {
		done := make(chan struct{})
		w.run(func() { ran.Add(1); close(done) })
		testwait.Recv(t, done)
		waitingIs(t, w, 3)
	}
	if n := w.started.Load() - before; n != 0 {
		t.Fatalf("%d goroutines started for tasks with workers waiting", n)
	}
	if ran.Load() != 3 {
		t.Fatalf("ran %d tasks", ran.Load())
	}
}

// Waiting workers end by themselves after idleFor: every worker's
// goroutine returns, with nothing stopping them.
func TestWorkersIdleEndByThemselves(t *testing.T) {
	w := newWorkers(3, 50*time.Millisecond)
	finishTen(t, w)
	testwait.Returns(t, w.wg.Wait) // w.close would stop them
	if n := w.idle.Load(); n != 0 {
		t.Fatalf("%d workers idle once every worker returned", n)
	}
}

// finishTen runs ten tasks on w at once, each waiting for the others to
// start, and waits for them to end.
func finishTen(t *testing.T, w *workers) {
	t.Helper()
	var started, finished sync.WaitGroup
	started.Add(10)
	finished.Add(10)
	for range 10 {
		w.run(func() { defer finished.Done(); started.Done(); started.Wait() })
	}
	testwait.Returns(t, finished.Wait)
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

// waitingIs waits until n of w's workers count themselves idle and n
// wait in their select for a task, as their goroutines' stacks say.
func waitingIs(t *testing.T, w *workers, n int32) {
	t.Helper()
	checkFor(t, func() error {
		if idle, waiting := w.idle.Load(), waitingWorkers(w); idle != n || waiting != int(n) {
			return fmt.Errorf("%d workers idle, %d waiting in their select; want %d", idle, waiting, n)
		}
		return nil
	})
}

// waitingWorkers counts the goroutines of w's workers blocked in a
// select: a worker's only select is its wait for a task.
func waitingWorkers(w *workers) int {
	mine := fmt.Sprintf("(*workers).work(%p", w)
	n := 0
	for _, g := range testwait.Goroutines() {
		// "goroutine 7 [select]:" or "[select, 2 minutes]:", then its frames.
		head, frames, _ := strings.Cut(g, "\n")
		if strings.Contains(head, " [select") && strings.Contains(frames, mine) {
			n++
		}
	}
	return n
}
