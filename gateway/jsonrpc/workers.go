package jsonrpc

import (
	"sync"
	"sync/atomic"
	"time"
)

// workers runs the handlers of a Server's connections on goroutines that
// outlive one request. A new goroutine starts with a small stack and grows
// it, copying, through the depth of a gRPC call on every request; a worker
// keeps the stack it grew (measured: stack growth was 16% of the gateway's
// CPU on session/state). Workers start on demand, so they never limit how
// many handlers run (the connections' own bounds do); at most maxIdle of
// them wait for work, each for at most idleFor. Server.Shutdown stops and
// waits for them; after a Serve ended by its context alone, the idle ones
// end within idleFor.
type workers struct {
	tasks   chan func() // unbuffered: a send succeeds only into a waiting worker
	quit    chan struct{}
	idle    atomic.Int32
	started atomic.Int64 // goroutines started, for tests
	maxIdle int32
	idleFor time.Duration
	wg      sync.WaitGroup
	stop    sync.Once
}

// Idle worker bounds: enough to serve a burst on every core without
// starting goroutines, few enough that the stacks they keep stay small.
const (
	maxIdleWorkers = 64
	workerIdleFor  = 10 * time.Second
)

func newWorkers(maxIdle int32, idleFor time.Duration) *workers {
	return &workers{tasks: make(chan func()), quit: make(chan struct{}), maxIdle: maxIdle, idleFor: idleFor}
}

// run runs f on a waiting worker, or on a new one.
func (w *workers) run(f func()) {
	select {
	case w.tasks <- f:
		return
	default:
	}
	w.wg.Add(1)
	w.started.Add(1)
	go w.work(f)
}

func (w *workers) work(f func()) {
	defer w.wg.Done()
	var t *time.Timer
	for {
		f()
		if w.idle.Add(1) > w.maxIdle {
			w.idle.Add(-1)
			return
		}
		if t == nil {
			t = time.NewTimer(w.idleFor)
		} else {
			t.Reset(w.idleFor)
		}
		select {
		case f = <-w.tasks:
			w.idle.Add(-1)
		case <-t.C:
			w.idle.Add(-1)
			return
		case <-w.quit:
			w.idle.Add(-1)
			t.Stop()
			return
		}
	}
}

// close stops the waiting workers and waits for every worker, those still
// running a task included, to return.
func (w *workers) close() {
	w.stop.Do(func() { close(w.quit) })
	w.wg.Wait()
}
