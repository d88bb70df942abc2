// Package handoff lets two servers in turn accept on one listener: a
// process that answers "starting" on its socket while its start waits,
// then serves on the same socket, without losing or double-accepting a
// connection.
package handoff

import (
	"net"
	"sync"
)

// Listener is a listener two servers accept on in turn: one goroutine
// accepts, and each server takes connections through a view of its own.
// Closing the first view stops only that server's accepting; the
// connections not taken yet go to the next. The final view's Close
// closes the listener.
type Listener struct {
	lis     net.Listener
	results chan accepted
	stop    chan struct{} // closed by close
	done    chan struct{} // closed when the accepting goroutine returns
	err     error         // why it returned; read after done
	once    sync.Once
}

type accepted struct {
	c   net.Conn
	err error
}

// New starts accepting on lis.
func New(lis net.Listener) *Listener {
	h := &Listener{lis: lis, results: make(chan accepted), stop: make(chan struct{}), done: make(chan struct{})}
	go h.accept()
	return h
}

func (h *Listener) accept() {
	defer close(h.done)
	for {
		c, err := h.lis.Accept()
		select {
		case h.results <- accepted{c, err}:
		case <-h.stop:
			if c != nil {
				c.Close()
			}
			h.err = net.ErrClosed
			return
		}
		if err != nil {
			// grpc retries a temporary error itself, after a pause.
			if te, ok := err.(interface{ Temporary() bool }); !ok || !te.Temporary() {
				h.err = err
				return
			}
		}
	}
}

// Close stops accepting and closes the listener.
func (h *Listener) Close() {
	h.once.Do(func() {
		close(h.stop)
		h.lis.Close()
	})
}

// View is one server's side of the listener; final closes it all.
func (h *Listener) View(final bool) net.Listener {
	return &view{h: h, final: final, closed: make(chan struct{})}
}

type view struct {
	h      *Listener
	final  bool
	closed chan struct{}
	once   sync.Once
}

func (v *view) Accept() (net.Conn, error) {
	select {
	case <-v.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case r := <-v.h.results:
		return r.c, r.err
	case <-v.closed:
		return nil, net.ErrClosed
	case <-v.h.done:
		return nil, v.h.err
	}
}

func (v *view) Close() error {
	v.once.Do(func() {
		close(v.closed)
		if v.final {
			v.h.Close()
		}
	})
	return nil
}

func (v *view) Addr() net.Addr { return v.h.lis.Addr() }
