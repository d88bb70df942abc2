//go:build !linux

package jsonrpc

import (
	"errors"
	"net"
	"syscall"
)

// inPlaceConn returns nil: the read loop reads through net.Conn, and the
// two below are never called.
func inPlaceConn(net.Conn) syscall.RawConn { return nil }

func readSocket(int, []byte) (int, error) { return 0, errors.ErrUnsupported }

func shutdownSocket(syscall.RawConn) {}
