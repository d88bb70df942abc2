package session

import (
	"context"
	"sync"
	"time"
)

// coalesced shares one read among the callers that arrive while the
// previous read is in flight: they wait for it to end, and one read then
// answers them all. A caller is never answered by a read that started
// before it arrived, so what it sees is as fresh as its own read would
// have been; under load the reads drop to one per read's duration.
type coalesced[T any] struct {
	// timeout bounds a shared read, which runs on no caller's
	// cancellation (a leader giving up must not fail the others).
	timeout time.Duration

	mu   sync.Mutex
	cur  *readBatch[T] // the read in flight, nil when none
	next *readBatch[T] // callers waiting for the next read, nil when none
}

type readBatch[T any] struct {
	done chan struct{} // closed once val and err are set
	val  T
	err  error
}

// do returns read's result for a read that started after do was called.
// The value is shared by every caller of the batch: treat it as read-only.
func (c *coalesced[T]) do(ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	c.mu.Lock()
	for {
		if c.cur == nil {
			// Nothing in flight: run the waiting batch (joining it) or a
			// new one, now.
			b := c.next
			if b == nil {
				b = &readBatch[T]{done: make(chan struct{})}
			}
			c.cur, c.next = b, nil
			c.mu.Unlock()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
			b.val, b.err = read(rctx)
			cancel()
			c.mu.Lock()
			c.cur = nil
			c.mu.Unlock()
			close(b.done)
			return b.val, b.err
		}
		// A read is in flight: wait for the next one.
		if c.next == nil {
			c.next = &readBatch[T]{done: make(chan struct{})}
		}
		b, inFlight := c.next, c.cur.done
		c.mu.Unlock()
		select {
		case <-b.done:
			return b.val, b.err
		case <-ctx.Done():
			var zero T
			return zero, context.Cause(ctx)
		case <-inFlight:
		}
		c.mu.Lock()
		if c.cur == b {
			// Another caller of the batch runs it.
			c.mu.Unlock()
			select {
			case <-b.done:
				return b.val, b.err
			case <-ctx.Done():
				var zero T
				return zero, context.Cause(ctx)
			}
		}
		// Loop: run b if nothing is in flight (c.next is still b, or b
		// already ran and b.done is closed), else wait again.
		select {
		case <-b.done:
			c.mu.Unlock()
			return b.val, b.err
		default:
		}
	}
}
