package grpcserver

import (
	"net"
	"sync"
)

// connTracker is a listener that keeps the connections it accepted until
// they close, so that they can be cut at once (cut). grpc's Stop closes
// only the connections past their handshake, and waits for the others:
// a client that connects and sends nothing held it for grpc's
// connection timeout (120 s).
type connTracker struct {
	net.Listener
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
	over  bool // cut ran: a connection accepted later is closed at once
}

func trackConns(lis net.Listener) *connTracker {
	return &connTracker{Listener: lis, conns: map[*trackedConn]struct{}{}}
}

func (t *connTracker) Accept() (net.Conn, error) {
	c, err := t.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over {
		c.Close() // its server reads the close as a failed handshake
		return tc, nil
	}
	t.conns[tc] = struct{}{}
	return tc, nil
}

// cut closes every connection accepted and not yet closed, and any
// accepted from now on.
func (t *connTracker) cut() {
	t.mu.Lock()
	conns := t.conns
	t.conns, t.over = map[*trackedConn]struct{}{}, true
	t.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	t *connTracker
}

func (c *trackedConn) Close() error {
	c.t.mu.Lock()
	delete(c.t.conns, c)
	c.t.mu.Unlock()
	return c.Conn.Close()
}
