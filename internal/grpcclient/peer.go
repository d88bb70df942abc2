package grpcclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/clawmesh/clawmesh/internal/procstat"
)

// A replica on this host is a process the client can look at: the pid
// of a Unix socket's peer is the kernel's (SO_PEERCRED, of the process
// that last called listen on it: listenfd makes a replica handed its
// socket by the launcher listen again, so that it is the replica), and
// /proc/<pid>/stat says whether it is stopped (state T: SIGSTOP, or t,
// stopped by a tracer). A stopped process answers nothing until someone
// continues it, which nothing in the stack does (the launcher kills it
// after its liveness limit): that is certain, where a check left
// unanswered for a while may be a starved process's. So a replica whose
// process is stopped is hung as soon as a check on its connection is
// slow (StateAfter), and a connect to it fails at once. Its CPU time
// tells a starved process from a stuck one: one that ran while a check
// went unanswered is not hung. With no pid (TCP, a peer in another pid
// namespace, whose pid the kernel gives as 0) the client knows only
// what the connection says, as before. A stop found is the process's
// to know, every client's of it (stops.go).

// StateAfter is how long a health check waits before the replica's
// process state is read, and then again every StateAfter while it
// waits: a check answers in a millisecond or two when the replica runs,
// so only slow ones cost a read of /proc.
const StateAfter = 100 * time.Millisecond

// readStat reads a process's stat line, and ownPID is this process's:
// a peer that is the client's own process (a test's replica served in
// it) is no evidence, its state being the test's. Tests replace both to
// stand for a process they cannot stop (their own).
var (
	readStat  = procstat.Read
	ownPID    = os.Getpid()
	peerPIDOf = peerPID
)

// peerProc is the process that serves a connection: its pid and when
// it started (the pid of a later process is not its).
type peerProc struct {
	pid   int
	start uint64
}

// sample is what is read of p's process now; ok false when the process
// is not p's any more (gone, its pid given to another) or unknown.
func (p peerProc) sample() (procstat.Stat, bool) {
	if p.pid <= 0 {
		return procstat.Stat{}, false
	}
	st, err := readStat(p.pid)
	if err != nil || p.start != 0 && st.Start != 0 && st.Start != p.start {
		return procstat.Stat{}, false
	}
	return st, true
}

// stopped reports whether st is a stopped process's (SIGSTOP, or a
// tracer's stop).
func stopped(st procstat.Stat) bool { return st.State == 'T' || st.State == 't' }

// peerInfo is a connection's AuthInfo: insecure, as Dial's, with the
// process that serves it.
type peerInfo struct {
	credentials.CommonAuthInfo
	proc peerProc
}

func (peerInfo) AuthType() string { return "insecure" }

// procOf is the process serving the connection a stream's ctx is on.
func procOf(ctx context.Context) peerProc {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return peerProc{}
	}
	info, _ := p.AuthInfo.(peerInfo)
	return info.proc
}

// errPeerStopped fails a connect to a replica whose process is stopped:
// its socket accepts (the kernel's backlog) and nothing would answer the
// handshake until ConnectTimeout.
type errPeerStopped struct {
	addr string
	pid  int
}

func (e errPeerStopped) Error() string {
	return fmt.Sprintf("%s accepts connections but its process %d is stopped: %s", e.addr, e.pid, StoppedOrHung)
}

// Temporary: gRPC tries the connect again after its backoff; that
// connect waits for the process to run (stopWait), without connecting.
func (errPeerStopped) Temporary() bool { return true }

// peerCreds are insecure transport credentials that learn, at each
// connect over a Unix socket, the process serving it, and tell the
// process's table (stops) and the client's connects (wait).
type peerCreds struct {
	credentials.TransportCredentials
	wait *stopWait
}

func newPeerCreds(w *stopWait) peerCreds { return peerCreds{insecure.NewCredentials(), w} }

func (c peerCreds) Clone() credentials.TransportCredentials {
	return peerCreds{c.TransportCredentials.Clone(), c.wait}
}

func (c peerCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, _, err := c.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil {
		return conn, nil, err
	}
	info := peerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return conn, info, nil
	}
	pid := peerPIDOf(uc)
	if pid <= 0 || pid == ownPID {
		return conn, info, nil
	}
	st, err := readStat(pid)
	if err != nil {
		return conn, info, nil
	}
	addr := conn.RemoteAddr().String()
	info.proc = peerProc{pid: pid, start: st.Start}
	stops.record(addr, info.proc, stopped(st))
	if stopped(st) {
		c.wait.tell(addr)
		return conn, nil, errPeerStopped{addr: addr, pid: pid}
	}
	return conn, info, nil
}

// peerPID is the pid of uc's peer, 0 when the kernel does not give one
// this process can see.
func peerPID(uc *net.UnixConn) int {
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0
	}
	var pid int
	if err := raw.Control(func(fd uintptr) {
		if cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	}); err != nil {
		return 0
	}
	return pid
}

// isPeerStopped reports whether err, a connect's, met a stopped process.
func isPeerStopped(err error) bool {
	var e errPeerStopped
	return errors.As(err, &e)
}
