package grpcclient

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// nameMethod is answered by namedReplica at once with its name.
const nameMethod = "/clawmesh.test.Named/Name"

// namedReplica serves health and answers every other method with its
// name, behind a relay that holds what it carries from the closing of
// freeze to that of thaw (a stopped process, then SIGCONT).
func namedReplica(t *testing.T, dir, name string, freeze, thaw <-chan struct{}) string {
	t.Helper()
	return relayedReplica(t, dir, name, freeze, thaw, func(_ any, ss grpc.ServerStream) error {
		var req emptypb.Empty
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		return ss.SendMsg(wrapperspb.String(name))
	})
}

// fakePeers makes each replica address of the test a process of its
// own: the connection's peer pid is pids[its address], and that pid's
// stat line is the test's own with State T while stopped[pid] is set.
type fakePeers struct {
	mu      sync.Mutex
	pids    map[string]int
	stopped map[int]bool
}

func newFakePeers(t *testing.T, addrs ...string) *fakePeers {
	t.Helper()
	f := &fakePeers{pids: map[string]int{}, stopped: map[int]bool{}}
	for i, a := range addrs {
		f.pids[a] = 1<<22 + i
	}
	oldRead, oldOwn, oldPID := readStat, ownPID, peerPIDOf
	t.Cleanup(func() { readStat, ownPID, peerPIDOf = oldRead, oldOwn, oldPID })
	ownPID = -1
	peerPIDOf = func(uc *net.UnixConn) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.pids[uc.RemoteAddr().String()]
	}
	readStat = func(pid int) (procstat.Stat, error) {
		st, err := procstat.Self()
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stopped[pid] {
			st.State = 'T'
		}
		return st, err
	}
	return f
}

func (f *fakePeers) set(addr string, stopped bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped[f.pids[addr]] = stopped
}

// countConnects counts the connects the clients make to each address.
func countConnects(t *testing.T) func(addr string) int64 {
	t.Helper()
	var mu sync.Mutex
	n := map[string]*atomic.Int64{}
	f := func(addr string) {
		mu.Lock()
		c := n[addr]
		if c == nil {
			c = new(atomic.Int64)
			n[addr] = c
		}
		mu.Unlock()
		c.Add(1)
	}
	connecting.Store(&f)
	t.Cleanup(func() { connecting.Store(nil) })
	return func(addr string) int64 {
		mu.Lock()
		defer mu.Unlock()
		if c := n[addr]; c != nil {
			return c.Load()
		}
		return 0
	}
}

// nameOf is the name of the replica that answers a call through cc
// within d, or the call's error, naming the socket it was sent on.
func nameOf(ctx context.Context, cc *grpc.ClientConn, d time.Duration) (string, error) {
	callCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var name wrapperspb.StringValue
	var p peer.Peer
	err := cc.Invoke(callCtx, nameMethod, &emptypb.Empty{}, &name, grpc.Peer(&p))
	if err != nil && p.Addr != nil {
		err = fmt.Errorf("sent to %s: %w", p.Addr, err)
	}
	return name.Value, err
}

// stoppedFor is how long the tests keep a replica stopped while they
// count what its clients do.
const stoppedFor = 3 * time.Second

// maxConnectsWhileStopped bounds the connects a client makes to a
// replica whose process stays stopped: the one that finds it stopped,
// and one more should the process be read between two of its states.
const maxConnectsWhileStopped = 2

// A replica whose process is stopped before the client connects: each
// connect was failed at once (its handshake reads the state), and gRPC
// connected again after its backoff, at most 100 ms, each connection
// left in the stopped process's backlog until it runs again. Once a
// connect has found the process stopped the client does not connect to
// that socket until the process runs: no more than
// maxConnectsWhileStopped connects in stoppedFor. Once it runs, the
// wait sees it (its state is read every StateAfter) and the replica
// answers again within resumedWithin, under the ConnectTimeout a wait
// that only ended with its connect's deadline would take.
func TestAStoppedReplicaIsNotConnectedToAgainUntilItRuns(t *testing.T) {
	freeze, thaw := make(chan struct{}), make(chan struct{})
	close(freeze)
	var once sync.Once
	resume := func() { once.Do(func() { close(thaw) }) }
	defer resume()
	addr := namedReplica(t, t.TempDir(), "r", freeze, thaw)
	peers := newFakePeers(t, addr)
	peers.set(addr, true)
	connects := countConnects(t)
	cc, ctx := replicasClient(t, addr)
	if _, err := nameOf(ctx, cc, underOldWait); !Unreachable(err) {
		t.Fatalf("the first call to a stopped replica: %v, want %s", err, NoReplicaReachable)
	}
	time.Sleep(stoppedFor)
	n := connects(addr)
	t.Logf("connects to the stopped replica in %v: %d", stoppedFor, n)
	if n > maxConnectsWhileStopped {
		t.Errorf("%d connects to a replica stopped for %v, want at most %d", n, stoppedFor, maxConnectsWhileStopped)
	}
	peers.set(addr, false)
	resume()
	resumed := time.Now()
	answerAgain(t, ctx, cc, "r", resumed)
}

// resumedWithin bounds how soon a replica that runs again must answer:
// under ConnectTimeout, the most a client would wait had it only its
// connect's deadline to end its wait. A bound, not a measure.
const resumedWithin = ConnectTimeout * 3 / 4

// answerAgain waits for cc's calls to be answered by the replica named
// want again, at most resumedWithin after resumed.
func answerAgain(t *testing.T, ctx context.Context, cc *grpc.ClientConn, want string, resumed time.Time) {
	t.Helper()
	var last error
	for time.Since(resumed) < resumedWithin {
		name, err := nameOf(ctx, cc, resumedWithin)
		if err == nil && name == want {
			t.Logf("%s answered again %v after it ran", want, time.Since(resumed).Round(time.Millisecond))
			return
		}
		last = err
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s not answering %v after it ran (last: %v)", want, resumedWithin, last)
}

// firstCallWithin bounds a call that must not wait for its own finding
// of a stop: under ProbeAfter + StateAfter, what a client's first call
// picked on a stopped replica waits before it knows. A bound on which
// replica answers, not a measure of speed.
const firstCallWithin = ProbeAfter

// Two clients of two replicas, a and b, both connected before a's
// process stops. The first client finds a stopped (a call of its own
// waited on it). The second client's first call picked on a waited for
// its own check, ProbeAfter + StateAfter, though the process had
// already been found stopped: its calls under firstCallWithin failed.
// Now what one client found is the process's (its pid and start time):
// each of the second client's calls is answered by b within
// firstCallWithin. Once a runs again, both clients use it again.
func TestASecondClientLeavesAReplicaAnotherFoundStopped(t *testing.T) {
	dir := t.TempDir()
	freeze, thaw, never := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { close(thaw) }) }
	defer resume()
	a := namedReplica(t, dir, "a", freeze, thaw)
	b := namedReplica(t, dir, "b", never, never)
	peers := newFakePeers(t, a, b)
	first, ctx := replicasClient(t, a+","+b)
	second, _ := replicasClient(t, a+","+b)
	for _, cc := range []*grpc.ClientConn{first, second} {
		bothAnswer(t, ctx, cc)
	}

	peers.set(a, true)
	close(freeze)
	// Two calls of one method take the two replicas in turn: one waits
	// on a until the first client finds its process stopped.
	res := make(chan error, 2)
	for range 2 {
		go func() {
			name, err := nameOf(ctx, first, underOldWait)
			if err == nil && name != "b" {
				err = fmt.Errorf("answered by %q", name)
			}
			res <- err
		}()
	}
	var found bool
	for range 2 {
		err := <-res
		if err == nil {
			continue
		}
		if !strings.Contains(status.Convert(err).Message(), "being stopped") {
			t.Fatalf("the first client's call on the stopped replica: %v, want its process stopped", err)
		}
		found = true
	}
	if !found {
		t.Fatal("no call of the first client was picked on the stopped replica")
	}

	for i := range 4 {
		name, err := nameOf(ctx, second, firstCallWithin)
		if err != nil || name != "b" {
			t.Fatalf("the second client's call %d, a known stopped: %q, %v; want b within %v", i, name, err, firstCallWithin)
		}
	}

	peers.set(a, false)
	resume()
	for _, cc := range []*grpc.ClientConn{first, second} {
		testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
			if name, err := nameOf(ctx, cc, 5*time.Second); err != nil || name != "a" {
				return fmt.Errorf("answered by %q: %v", name, err)
			}
			return nil
		})
	}
}

// bothAnswer calls through cc until each of a and b has answered.
func bothAnswer(t *testing.T, ctx context.Context, cc *grpc.ClientConn) {
	t.Helper()
	seen := map[string]bool{}
	testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() error {
		name, err := nameOf(ctx, cc, 5*time.Second)
		if err != nil {
			return err
		}
		seen[name] = true
		if !seen["a"] || !seen["b"] {
			return fmt.Errorf("answered by %v so far", seen)
		}
		return nil
	})
}

// A finding that a socket's process is stopped holds only for that
// process: read again, it is forgotten once the pid is another
// process's (its start time differs), once the process runs, or once
// another socket file is at the path (a new listener); and the table
// keeps at most maxKnownPeers addresses, the stopped ones counted right
// through evictions.
func TestAStopFoundHoldsOnlyForItsProcess(t *testing.T) {
	self, err := procstat.Self()
	if err != nil {
		t.Fatal(err)
	}
	var state atomic.Int32
	state.Store('T')
	var start atomic.Uint64
	start.Store(self.Start)
	oldRead := readStat
	t.Cleanup(func() { readStat = oldRead })
	readStat = func(int) (procstat.Stat, error) {
		st := self
		st.State, st.Start = byte(state.Load()), start.Load()
		return st, nil
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "r.sock")
	listen := func() net.Listener {
		lis, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		return lis
	}
	lis := listen()
	defer func() { lis.Close() }()
	tab := &stopTable{byAddr: map[string]knownPeer{}}
	proc := peerProc{pid: 1 << 22, start: self.Start}
	found := func(why string, want bool) {
		t.Helper()
		tab.record(sock, proc, true)
		if _, got := tab.stoppedNow(sock); got != want {
			t.Errorf("%s: stopped %v, want %v", why, got, want)
		}
	}
	found("its process stopped", true)
	start.Store(self.Start + 1)
	found("its pid another process's", false)
	start.Store(self.Start)
	state.Store('S')
	found("its process running", false)
	if n := tab.nStopped.Load(); n != 0 {
		t.Errorf("%d counted stopped once none is", n)
	}
	state.Store('T')
	tab.record(sock, proc, true)
	// As a stopped listener's socket holds its file: the new one is
	// another inode.
	if err := os.Link(sock, sock+".old"); err != nil {
		t.Fatal(err)
	}
	lis.Close()
	lis = listen()
	if _, got := tab.stoppedNow(sock); got {
		t.Error("another socket file at the path: still taken for the stopped process's")
	}

	for i := range 2 * maxKnownPeers {
		tab.record(filepath.Join(dir, "x", strconv.Itoa(i)), proc, true)
	}
	if n, s := len(tab.byAddr), tab.nStopped.Load(); n != maxKnownPeers || s != maxKnownPeers {
		t.Errorf("after %d addresses: %d kept, %d counted stopped; want %d", 2*maxKnownPeers, n, s, maxKnownPeers)
	}
}
