package grpcclient

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// What one DialReplicas client finds of a replica's process is the
// process's, not the client's: the gateway's plugins/list client, its
// other clients and any made later in the same process ask the same
// process. So a finding that it is stopped is kept for the whole
// process (stops), by socket address, the address naming the process
// that served it (pid and start time, so that a pid given to a later
// process is not taken for it, and the socket file, so that a new
// listener at the path is not): a pick on that address, in any
// client, reads the process's state (one read of /proc/<pid>/stat, and
// only while some address is known stopped) and leaves the replica as
// hung at once, where the client's own finding waited for ProbeAfter +
// StateAfter. The finding is evidence to look again, not a verdict:
// each use reads the state anew, and a process that runs again is
// forgotten at the first read that sees it.
//
// A client does not connect to a socket whose process is stopped
// either (stopWait): each connect sat in the process's backlog until it
// ran again, and gRPC made one after every failed one, up to ten a
// second. Its first connect after the finding fails at once, as a
// connect whose handshake reads the state does, so that the replica
// counts as gone; the ones after wait, without connecting, for the
// process to run (its state read every StateAfter) or for the
// connect's deadline (ConnectTimeout), and fail then as stopped.

// maxKnownPeers bounds the addresses stops keeps: a process dials a few
// replicas' sockets. Past it the one seen longest ago is forgotten.
const maxKnownPeers = 256

// stops is the process's table of replica sockets and their processes.
var stops = &stopTable{byAddr: map[string]knownPeer{}}

// knownPeer is the process last seen serving a socket address.
type knownPeer struct {
	proc    peerProc
	file    fileID // the socket file then (zero: not read)
	stopped bool   // found stopped, not seen to run since
	seen    time.Time
}

type stopTable struct {
	mu     sync.Mutex
	byAddr map[string]knownPeer
	// nStopped counts the entries found stopped: a pick reads it, and
	// looks no further while it is 0.
	nStopped atomic.Int32
}

// record notes that addr is served by proc, found stopped or not. Only
// socket paths are kept: a TCP peer has no process here.
func (s *stopTable) record(addr string, proc peerProc, stopped bool) {
	if proc.pid <= 0 || !strings.HasPrefix(addr, "/") {
		return
	}
	file := inode(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.byAddr[addr]
	if !had && len(s.byAddr) >= maxKnownPeers {
		s.evictLocked()
	}
	if had && old.stopped {
		s.nStopped.Add(-1)
	}
	if stopped {
		s.nStopped.Add(1)
	}
	s.byAddr[addr] = knownPeer{proc: proc, file: file, stopped: stopped, seen: time.Now()}
}

func (s *stopTable) evictLocked() {
	var oldest string
	var at time.Time
	for a, k := range s.byAddr {
		if oldest == "" || k.seen.Before(at) {
			oldest, at = a, k.seen
		}
	}
	if s.byAddr[oldest].stopped {
		s.nStopped.Add(-1)
	}
	delete(s.byAddr, oldest)
}

// runs notes that proc, serving addr, answered: it is not stopped.
func (s *stopTable) runs(addr string, proc peerProc) {
	if s.nStopped.Load() == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.byAddr[addr]; ok && k.stopped && k.proc == proc {
		k.stopped = false
		s.byAddr[addr] = k
		s.nStopped.Add(-1)
	}
}

// stoppedNow reports whether addr's process was found stopped and is
// stopped still (read now), and which process it is.
func (s *stopTable) stoppedNow(addr string) (peerProc, bool) {
	if s.nStopped.Load() == 0 {
		return peerProc{}, false
	}
	s.mu.Lock()
	k, ok := s.byAddr[addr]
	s.mu.Unlock()
	if !ok || !k.stopped {
		return peerProc{}, false
	}
	if st, ok := k.proc.sample(); ok && stopped(st) && (k.file == fileID{} || inode(addr) == k.file) {
		return k.proc, true
	}
	s.runs(addr, k.proc)
	return peerProc{}, false
}

// fileID names the socket file at a path: its inode and when it was
// made (an inode freed is given to the next file at once).
type fileID struct {
	ino   uint64
	ctime int64
}

// inode is the socket file at path, zero when it cannot be read.
func inode(path string) fileID {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}
	}
	return fileID{ino: st.Ino, ctime: st.Ctim.Nano()}
}

// stopWait is one client's connects to its replicas' sockets while
// their processes are stopped (the table above).
type stopWait struct {
	mu sync.Mutex
	// told: addresses whose last connect failed for a stopped process,
	// so that the replica counts as gone already; one a replica of the
	// client, bounded all the same.
	told map[string]bool
}

func newStopWait() *stopWait { return &stopWait{told: map[string]bool{}} }

// tell records that a connect to addr failed for a stopped process, and
// reports whether one had failed so before.
func (w *stopWait) tell(addr string) (before bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before = w.told[addr]
	if !before && len(w.told) < maxKnownPeers {
		w.told[addr] = true
	}
	return before
}

func (w *stopWait) forget(addr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.told, addr)
}

// dial is the client's dialer: it connects to addr unless its process
// is known stopped, then fails at once the first time and waits for it
// to run the times after.
func (w *stopWait) dial(ctx context.Context, addr string) (net.Conn, error) {
	if proc, ok := stops.stoppedNow(addr); ok {
		if !w.tell(addr) {
			return nil, errPeerStopped{addr: addr, pid: proc.pid}
		}
		t := time.NewTicker(StateAfter)
		defer t.Stop()
		for ok {
			select {
			case <-ctx.Done():
				// gRPC connects again after its backoff, to wait again.
				return nil, errPeerStopped{addr: addr, pid: proc.pid}
			case <-t.C:
			}
			_, ok = stops.stoppedNow(addr)
		}
	}
	w.forget(addr)
	return dialer(ctx, addr)
}
