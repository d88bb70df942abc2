// Package coalesce shares a read among the callers that ask for the same
// thing at the same time, without ever answering a caller with a read that
// began before it asked.
//
// A caller arriving while a read of its key is in flight does not join
// that read (it may have read the state before the caller's own last
// write); it waits for the read to end, and one read started then answers
// every caller that waited. What a caller sees is therefore as fresh as
// its own read would have been, and under load the reads of a key drop to
// one per read's duration, whatever the number of callers.
package coalesce

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Group coalesces reads by key. The zero value is ready to use. Its memory
// is bounded by its callers: a key is kept only while a caller of it is
// inside Do.
type Group[K comparable, T any] struct {
	// Timeout bounds a shared read from its start (zero: no bound of the
	// group's). A shared read runs on no caller's cancellation or
	// deadline, so that a caller giving up does not fail the others; each
	// caller still stops waiting at its own deadline. The caller that runs
	// the read waits for it to end, at most Timeout.
	Timeout time.Duration

	mu   sync.Mutex
	keys map[K]*slot[T]
}

type slot[T any] struct {
	cur     *batch[T] // the read in flight, nil when none
	next    *batch[T] // callers waiting for the next read, nil when none
	callers int       // callers inside Do for this key
}

type batch[T any] struct {
	done  chan struct{} // closed once val and err are set
	ended bool          // set under Group.mu as the slot's cur is cleared
	val   T
	err   error
}

// Do returns read's result for a read of key that started after Do was
// called. The value is shared by every caller of the batch: treat it as
// read-only. A caller whose ctx ends while it waits returns ctx's cause.
func (g *Group[K, T]) Do(ctx context.Context, key K, read func(context.Context) (T, error)) (T, error) {
	g.mu.Lock()
	s := g.keys[key]
	if s == nil {
		if g.keys == nil {
			g.keys = make(map[K]*slot[T])
		}
		s = &slot[T]{}
		g.keys[key] = s
	}
	s.callers++
	// Every path below returns with g.mu released.
	defer func() {
		g.mu.Lock()
		if s.callers--; s.callers == 0 {
			delete(g.keys, key)
		}
		g.mu.Unlock()
	}()
	for {
		if s.cur == nil {
			// Nothing in flight: run the waiting batch (joining it) or a
			// new one, now.
			b := s.next
			if b == nil {
				b = &batch[T]{done: make(chan struct{})}
			}
			s.cur, s.next = b, nil
			g.mu.Unlock()
			g.run(ctx, s, b, read)
			return b.val, b.err
		}
		// A read is in flight: wait for the next one.
		if s.next == nil {
			s.next = &batch[T]{done: make(chan struct{})}
		}
		b, inFlight := s.next, s.cur.done
		g.mu.Unlock()
		if ran, val, err := b.wait(ctx, inFlight); ran {
			return val, err
		}
		g.mu.Lock()
		if s.cur == b {
			// Another caller of the batch runs it.
			g.mu.Unlock()
			_, val, err := b.wait(ctx, nil)
			return val, err
		}
		// b may have run and ended while we were away.
		if b.ended {
			g.mu.Unlock()
			return b.val, b.err
		}
		// Loop: run b if nothing is in flight (s.next is still b), else
		// wait again.
	}
}

// run runs b's read and ends the batch, even when read panics: the
// panic goes on up the runner's stack, the batch's other callers get
// ErrReadPanicked, and the key's next read can start (a batch left in
// flight would make every later caller of the key wait out its deadline).
func (g *Group[K, T]) run(ctx context.Context, s *slot[T], b *batch[T], read func(context.Context) (T, error)) {
	defer func() {
		g.mu.Lock()
		s.cur, b.ended = nil, true
		g.mu.Unlock()
		close(b.done)
	}()
	rctx, cancel := g.readContext(ctx)
	defer cancel()
	b.err = ErrReadPanicked // unless read returns
	b.val, b.err = read(rctx)
}

// ErrReadPanicked is what the callers sharing a read get when it panicked
// (its runner gets the panic).
var ErrReadPanicked = errors.New("coalesce: the shared read panicked")

// wait waits for b's read, ctx's end or, when it is not nil, the end of
// the read in flight. ran is false when only inFlight ended.
func (b *batch[T]) wait(ctx context.Context, inFlight <-chan struct{}) (ran bool, val T, err error) {
	select {
	case <-b.done:
		return true, b.val, b.err
	case <-ctx.Done():
		return true, val, context.Cause(ctx)
	case <-inFlight:
		return false, val, nil
	}
}

// readContext is the context of a shared read: ctx's values, neither its
// cancellation nor its deadline (the caller that runs the read is often
// the one that waited longest, with the least time left: its deadline
// would fail callers that had time to spare), and Timeout from now.
func (g *Group[K, T]) readContext(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx := context.WithoutCancel(ctx)
	if g.Timeout > 0 {
		return context.WithTimeout(rctx, g.Timeout)
	}
	return context.WithCancel(rctx)
}

// Len reports how many keys have callers inside Do (for tests and
// diagnostics).
func (g *Group[K, T]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.keys)
}
