// Package countio reads a stream to its end on a goroutine of its own,
// counting the bytes, for the benchmarks that write to a socket and must
// know when what they wrote has reached the other end: each write then
// goes to an idle socket, as a paced stream's do, instead of piling up
// behind a reader the benchmark starved.
//
// It is for tests and benchmarks only; no binary imports it.
package countio

import (
	"io"
	"sync/atomic"
)

// bufSize is what one Read may take: more than a socket's buffer, so a
// frame that is there whole is counted in one read.
const bufSize = 64 << 10

// Drain reads r to its end, counting what it read.
type Drain struct {
	n atomic.Int64
	// progressed holds one token when a read came since the last look:
	// a waiter blocks on it rather than spins, which on one processor
	// kept the reader, woken only from the network poller, from running.
	progressed chan struct{}
	done       chan struct{}
}

// Start starts reading r until a read fails (its end, or r closed). The
// caller owns the goroutine: it ends r and then calls Wait.
func Start(r io.Reader) *Drain {
	d := &Drain{progressed: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		buf := make([]byte, bufSize)
		for {
			n, err := r.Read(buf)
			d.n.Add(int64(n))
			select {
			case d.progressed <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	return d
}

// N is the count of bytes read so far.
func (d *Drain) N() int64 { return d.n.Load() }

// WaitFor waits until exactly n bytes have been read, and reports whether
// they were: false when stop closed first (the writer's end failed), or
// the reading ended short of n.
func (d *Drain) WaitFor(n int64, stop <-chan struct{}) bool {
	for d.n.Load() != n {
		select {
		case <-d.progressed:
		case <-stop:
			return d.n.Load() == n
		case <-d.done:
			return d.n.Load() == n
		}
	}
	return true
}

// Wait waits for the reading to end (the caller ended r first) and
// returns the count of all it read.
func (d *Drain) Wait() int64 {
	<-d.done
	return d.n.Load()
}
