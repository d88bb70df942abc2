//go:build !linux

package jsonrpc

import (
	"net"
	"syscall"
)

// inPlaceConn returns nil: the read loop reads through net.Conn.
func inPlaceConn(net.Conn) syscall.RawConn { return nil }

// socketSource is never made here (inPlaceConn is nil).
type socketSource struct {
	fd           int
	empty, ready bool
}

func (s *socketSource) Read([]byte) (int, error) { return 0, errWouldBlock }

func shutdownSocket(syscall.RawConn) {}
