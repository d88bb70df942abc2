//go:build !linux

package jsonrpc

import "net"

// PeerOf returns -1 fields: peer credentials are read on Linux only.
func PeerOf(nc net.Conn) Peer { return Peer{PID: -1, UID: -1, GID: -1} }

func peerHungUp(nc net.Conn) bool { return false }

// sendQueue returns nil: the kernel's send queue is read on Linux only.
func sendQueue(nc net.Conn) func() (int, bool) { return nil }

// writeNow returns nil: replies that must not wait go through the writer.
func writeNow(nc net.Conn) func([]byte) (int, error) { return nil }
