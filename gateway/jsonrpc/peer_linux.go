//go:build linux

package jsonrpc

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// PeerOf returns the credentials of the process at the other end of a Unix
// socket (SO_PEERCRED), or -1 fields when they are unavailable.
func PeerOf(nc net.Conn) Peer {
	p := Peer{PID: -1, UID: -1, GID: -1}
	raw := rawConn(nc)
	if raw == nil {
		return p
	}
	_ = raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err == nil {
			p.PID, p.UID, p.GID = cred.Pid, int32(cred.Uid), int32(cred.Gid)
		}
	})
	return p
}

// peerHungUp reports whether the peer of a Unix socket has closed both
// directions (POLLHUP), as opposed to shutting down only its sending side.
// For other connections it reports false.
func peerHungUp(nc net.Conn) bool {
	raw := rawConn(nc)
	if raw == nil {
		return false
	}
	hup := false
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hup = fds[0].Revents&unix.POLLHUP != 0
		}
	})
	return hup
}

// sendQueue returns a function reporting how many bytes the kernel holds
// for the peer of a Unix socket and has not yet seen it read (SIOCOUTQ:
// for AF_UNIX the memory charged to our side, which the peer's reads
// free), or nil for other connections.
func sendQueue(nc net.Conn) func() (int, bool) {
	raw := rawConn(nc)
	if raw == nil {
		return nil
	}
	return func() (int, bool) {
		var n int
		var err error
		if cerr := raw.Control(func(fd uintptr) {
			n, err = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		}); cerr != nil || err != nil {
			return 0, false
		}
		return n, true
	}
}

func rawConn(nc net.Conn) syscall.RawConn {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// writeNow returns a function writing to a Unix socket what its buffer
// takes at once, without waiting for room (one non-blocking write), or nil
// for other connections.
func writeNow(nc net.Conn) func([]byte) (int, error) {
	raw := rawConn(nc)
	if raw == nil {
		return nil
	}
	return func(b []byte) (int, error) {
		var n int
		var err error
		if rerr := raw.Write(func(fd uintptr) bool {
			for {
				n, err = unix.Write(int(fd), b)
				if err != unix.EINTR {
					return true // done, or full (EAGAIN): no waiting either way
				}
			}
		}); rerr != nil {
			return 0, rerr
		}
		if err == unix.EAGAIN {
			return 0, nil
		}
		return max(n, 0), err
	}
}
