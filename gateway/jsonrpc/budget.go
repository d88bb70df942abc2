package jsonrpc

import (
	"sync"
	"time"
)

// DefaultMaxBufferedFrameBytes is the capacity of the FrameBudget a Server
// makes when Options.FrameBudget is nil: 128 MiB of unfinished frames
// across all its connections.
const DefaultMaxBufferedFrameBytes = 128 << 20

// FrameBudget bounds the memory that unfinished incoming frames hold across
// every connection sharing it. Each connection reads into a block of
// 64 KiB that the budget does not count (MaxConnections bounds those); a
// larger frame goes on into further 64 KiB blocks, each reserved before it
// is read into, and once complete is copied into one slice of its size,
// reserved before the copy, while the blocks are still held (so one 8 MiB
// frame reserves up to 16 MiB for a moment). When the budget is spent the
// connection waits, reading no more of that frame, until other
// connections return budget or the frame timeout cuts it off (the usual
// -32600 frame_timeout). Budget comes back when the frame is complete and
// handed over or dropped, and when the connection closes.
//
// Without a shared budget, 50 connections each sending 8 MiB without a
// newline hold 400 MiB, and any number more hold more. With it the total
// is capacity plus 64 KiB a connection. A capacity below twice
// MaxFrameBytes lets no frame that large complete: keep it well above.
//
// A FrameBudget is safe for concurrent use.
type FrameBudget struct {
	capacity int64

	mu    sync.Mutex
	used  int64
	peak  int64         // the most ever reserved at once
	waits int64         // reservations that had to wait
	freed chan struct{} // closed when budget returns while someone waits
}

// NewFrameBudget returns a budget of capacity bytes (at least 1).
func NewFrameBudget(capacity int64) *FrameBudget {
	return &FrameBudget{capacity: max(capacity, 1)}
}

// Capacity returns the budget's size in bytes.
func (b *FrameBudget) Capacity() int64 { return b.capacity }

// Reserved returns the bytes currently reserved; never above Capacity.
func (b *FrameBudget) Reserved() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// reserve takes n bytes, waiting while they are not available until
// deadline (zero: none), where it fails with ErrFrameTimeout, or until
// done is closed, where it fails with ErrClosed.
func (b *FrameBudget) reserve(n int64, deadline time.Time, done <-chan struct{}) error {
	b.mu.Lock()
	if b.take(n) {
		b.mu.Unlock()
		return nil
	}
	b.waits++
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	for {
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-expired:
			return ErrFrameTimeout
		case <-done:
			return ErrClosed
		}
		b.mu.Lock()
		if b.take(n) {
			b.mu.Unlock()
			return nil
		}
	}
}

// take reserves n bytes if they are free. b.mu is held.
func (b *FrameBudget) take(n int64) bool {
	if b.used+n > b.capacity {
		return false
	}
	b.used += n
	b.peak = max(b.peak, b.used)
	return true
}

// release returns n reserved bytes and wakes the waiters.
func (b *FrameBudget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}
