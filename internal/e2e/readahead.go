package e2e

import (
	"net"
	"os"
	"sync"
	"time"
)

// readAheadMax bounds what a read-ahead client holds unread.
const readAheadMax = 64 << 20

// readAhead is a client's end of the gateway's socket with a goroutine
// that reads it as fast as the gateway writes, into memory (up to
// readAheadMax), whatever the test does meanwhile. A test that shortens
// the write-stall limit (two seconds) has its healthy client read this
// way: decoding a frame of 1 MB under the race detector took that long
// on a loaded machine, during which the frames behind it waited unread
// and the gateway rightly closed the client as stalled.
type readAhead struct {
	net.Conn

	mu       sync.Mutex
	buf      []byte
	err      error     // the socket's read error, once buf is drained
	deadline time.Time // for Read, as net.Conn's read deadline

	more   chan struct{} // signalled when buf grows or err is set
	room   chan struct{} // signalled when buf shrinks
	closed chan struct{}
	once   sync.Once
	done   chan struct{} // closed when fill has returned
}

func newReadAhead(c net.Conn) *readAhead {
	r := &readAhead{Conn: c, more: make(chan struct{}, 1), room: make(chan struct{}, 1),
		closed: make(chan struct{}), done: make(chan struct{})}
	go r.fill()
	return r
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (r *readAhead) fill() {
	defer close(r.done)
	b := make([]byte, 64<<10)
	for {
		r.mu.Lock()
		full := len(r.buf) >= readAheadMax
		r.mu.Unlock()
		if full {
			select {
			case <-r.room:
				continue
			case <-r.closed:
				return
			}
		}
		n, err := r.Conn.Read(b)
		r.mu.Lock()
		r.buf = append(r.buf, b[:n]...)
		if err != nil {
			r.err = err
		}
		r.mu.Unlock()
		signal(r.more)
		if err != nil {
			return
		}
	}
}

// Read returns what fill has read, waiting for some until the read
// deadline.
func (r *readAhead) Read(p []byte) (int, error) {
	for {
		r.mu.Lock()
		if len(r.buf) > 0 {
			n := copy(p, r.buf)
			r.buf = r.buf[n:]
			if len(r.buf) == 0 {
				r.buf = nil
			}
			r.mu.Unlock()
			signal(r.room)
			return n, nil
		}
		err, deadline := r.err, r.deadline
		r.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if !r.wait(deadline) {
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// wait waits for fill to signal, false if the deadline passed first.
func (r *readAhead) wait(deadline time.Time) bool {
	if deadline.IsZero() {
		<-r.more
		return true
	}
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-r.more:
		return true
	case <-timer.C:
		return false
	}
}

func (r *readAhead) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	r.deadline = t
	r.mu.Unlock()
	return nil
}

func (r *readAhead) SetDeadline(t time.Time) error {
	_ = r.SetReadDeadline(t)
	return r.Conn.SetWriteDeadline(t)
}

// Close closes the socket and waits for fill to end.
func (r *readAhead) Close() error {
	var err error
	r.once.Do(func() {
		close(r.closed)
		err = r.Conn.Close()
	})
	<-r.done
	return err
}
