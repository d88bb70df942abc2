package jsonrpc

import (
	"sync"
	"sync/atomic"
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

// DefaultMaxBufferedOutputBytes is the capacity of the OutputBudget a
// Server makes when Options.OutputBudget is nil: 256 MiB of output queued
// for peers across all its connections.
const DefaultMaxBufferedOutputBytes = 256 << 20

// FairOutputShare is what one holder may keep queued, and add to, while
// an OutputBudget is spent (or one frame of any size, queued when it held
// nothing).
const FairOutputShare = 2 << 20

// OutputBudget bounds the output held for peers that do not read it,
// across every connection sharing it. Each connection's queue is bounded
// alone (Options.MaxPendingBytes), but replies to requests already in
// flight are queued past it (they cannot wait: see sendNoWait), and a
// connection may hold MaxPendingBytes: twelve connections that pipelined
// requests for 4 MiB pages and read nothing held 1.9 GiB together within
// 25 s, and each more held more. Once the budget is spent, a holder with
// more than FairOutputShare queued is closed when it would queue more,
// as one that stalled would be (a reply is never dropped from a stream
// that goes on); the holders with little keep theirs. Other holders than
// a Conn (the gateway's backlogs of session updates) share it through
// Charge and Admits.
//
// An OutputBudget is safe for concurrent use; its methods do nothing on a
// nil one.
type OutputBudget struct {
	capacity int64
	held     atomic.Int64
}

// NewOutputBudget returns a budget of capacity bytes (at least
// FairOutputShare).
func NewOutputBudget(capacity int64) *OutputBudget {
	return &OutputBudget{capacity: max(capacity, FairOutputShare)}
}

// Capacity returns the budget's size in bytes.
func (b *OutputBudget) Capacity() int64 {
	if b == nil {
		return 0
	}
	return b.capacity
}

// Held returns the bytes charged and not yet returned; it may pass
// Capacity by what the holders under their fair share added.
func (b *OutputBudget) Held() int64 {
	if b == nil {
		return 0
	}
	return b.held.Load()
}

// Charge adds n bytes (returns them when n is negative).
func (b *OutputBudget) Charge(n int64) {
	if b != nil && n != 0 {
		b.held.Add(n)
	}
}

// Admits reports whether a holder of own bytes may queue n more: always
// when it holds nothing (a reader that keeps up gets any reply, however
// large) or stays within its fair share, and past it only while the
// budget has room.
func (b *OutputBudget) Admits(own, n int64) bool {
	return b == nil || own <= 0 || own+n <= FairOutputShare || b.held.Load()+n <= b.capacity
}
