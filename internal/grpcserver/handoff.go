package grpcserver

import (
	"net"
	"sync"
)

// handoff lets two servers in turn accept on one listener (ServeEarly):
// one goroutine accepts, and each server takes connections through a
// view of its own. Closing the first view stops only that server's
// accepting; the connections not taken yet go to the next. The final
// view's Close closes the listener.
type handoff struct {
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

func newHandoff(lis net.Listener) *handoff {
	h := &handoff{lis: lis, results: make(chan accepted), stop: make(chan struct{}), done: make(chan struct{})}
	go h.accept()
	return h
}

func (h *handoff) accept() {
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

func (h *handoff) close() {
	h.once.Do(func() {
		close(h.stop)
		h.lis.Close()
	})
}

// view is one server's side of the listener; final closes it all.
func (h *handoff) view(final bool) net.Listener {
	return &handoffView{h: h, final: final, closed: make(chan struct{})}
}

type handoffView struct {
	h      *handoff
	final  bool
	closed chan struct{}
	once   sync.Once
}

func (v *handoffView) Accept() (net.Conn, error) {
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

func (v *handoffView) Close() error {
	v.once.Do(func() {
		close(v.closed)
		if v.final {
			v.h.close()
		}
	})
	return nil
}

func (v *handoffView) Addr() net.Addr { return v.h.lis.Addr() }
