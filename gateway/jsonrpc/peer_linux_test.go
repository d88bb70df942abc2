//go:build linux

package jsonrpc

import (
	"os"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// TestPeerCredentials: SO_PEERCRED gives this process's pid and uid.
func TestPeerCredentials(t *testing.T) {
	peers := make(chan Peer, 1)
	ts := startServer(t, &Server{NewHandler: func(_ *Conn, p Peer) Handler {
		peers <- p
		return &testHandler{}
	}}, nil)
	dial(t, ts.path)
	p := testwait.Recv(t, peers)
	if p.PID != int32(os.Getpid()) || p.UID != int32(os.Getuid()) {
		t.Fatalf("peer %+v, want pid %d uid %d", p, os.Getpid(), os.Getuid())
	}
}
