//go:build linux

package jsonrpc

import (
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// inPlaceConn returns the raw connection the read loop reads in place
// (readInPlace), or nil where it reads through net.Conn.
func inPlaceConn(nc net.Conn) syscall.RawConn { return rawConn(nc) }

// socketSource reads a socket's descriptor inside its RawConn.Read.
// After a read that left the socket empty (it returned less than asked),
// the next read is not tried: it would find nothing, as a client that
// waits for each answer has sent nothing yet. It reports errWouldBlock
// instead, and the runtime's poller waits for the socket; the read after
// that wait (ready) is tried. A read that fills the buffer may have left
// bytes behind, which no new readiness would announce, so the next one is
// tried at once.
type socketSource struct {
	fd    int
	empty bool // the last read left the socket empty
	ready bool // the poller reported the socket readable since then
}

func (s *socketSource) Read(p []byte) (int, error) {
	if s.empty && !s.ready {
		return 0, errWouldBlock
	}
	s.ready = false
	for {
		n, err := unix.Read(s.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			s.empty = true
			return 0, errWouldBlock
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		s.empty = n < len(p)
		return n, nil
	}
}

// shutdownSocket ends both directions of the socket without closing its
// descriptor: the peer reads the end, and a wait for it in the read loop
// returns.
func shutdownSocket(rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}
