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

// readSocket reads a non-blocking socket once: errWouldBlock when it
// holds nothing, io.EOF at its end.
func readSocket(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Read(fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// shutdownSocket ends both directions of the socket without closing its
// descriptor: the peer reads the end, and a wait for it in the read loop
// returns.
func shutdownSocket(rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}
