package grpcclient

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// underOldWait bounds a call that must end because its replica's process
// is stopped: under the ProbeAfter + ProbeTimeout (2.5 s) a check left
// unanswered took to find it, so only the process's state can end it in
// time. A bound on what is answered, not a measure of speed.
const underOldWait = ProbeTimeout

// asPeer makes the replicas this test serves in its own process count as
// processes of their own (ownPID), whose state is the test's own stat
// line with State replaced by state() when that is not 0.
func asPeer(t *testing.T, state func() byte) {
	t.Helper()
	oldRead, oldOwn := readStat, ownPID
	t.Cleanup(func() { readStat, ownPID = oldRead, oldOwn })
	ownPID = -1
	readStat = func(pid int) (procstat.Stat, error) {
		st, err := procstat.Read(pid)
		if err == nil {
			if s := state(); s != 0 {
				st.State = s
			}
		}
		return st, err
	}
}

// A replica's process stopped (SIGSTOP) with a call in flight on the
// client's connection to it: the call waited for a health check left
// unanswered for ProbeTimeout, 2.5 s after its start at the least. The
// process's state (T) is certain where the silence is not, and is read
// as soon as a check is slow: the call ends within underOldWait, saying
// the process is stopped, and the next call fails at once.
func TestACallOnAStoppedReplicaEndsOnItsProcessState(t *testing.T) {
	var frozen atomic.Bool
	asPeer(t, func() byte {
		if frozen.Load() {
			return 'T'
		}
		return 0
	})
	freeze, thaw := make(chan struct{}), make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { frozen.Store(false); close(thaw) }) }
	defer resume()
	addr, started := slowReplica(t, t.TempDir(), "r", freeze, thaw)
	cc, ctx := replicasClient(t, addr)
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	callCtx, cancel := context.WithTimeout(ctx, underOldWait)
	defer cancel()
	inFlight := make(chan error, 1)
	go func() { inFlight <- cc.Invoke(callCtx, slowMethod, &emptypb.Empty{}, &emptypb.Empty{}) }()
	<-started
	frozen.Store(true)
	close(freeze)
	frozeAt := time.Now()
	err := <-inFlight
	t.Logf("the call in flight failed %v after the stop: %v", time.Since(frozeAt).Round(time.Millisecond), err)
	if st := status.Convert(err); st.Code() != codes.Unavailable || !NotAnswering(err) || !strings.Contains(st.Message(), "being stopped") {
		t.Fatalf("a call on a stopped replica, within %v: %v; want Unavailable, its process stopped", underOldWait, err)
	}
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if !Unreachable(err) || !NotAnswering(err) {
		t.Errorf("a call once the only replica is stopped: %v, want %s, stopped or hung", err, NoReplicaReachable)
	}
	resume()
	waitAnswered(t, cc, ctx)
}

// A replica whose process is stopped before the client ever connected:
// the connect was accepted (the kernel's backlog) and timed out after
// ConnectTimeout, and calls failed only once RestartGrace had run, 3 s.
// The connect now reads the process's state and fails at once, and the
// replica counts as gone at once: the first call fails within
// underOldWait saying no replica answers.
func TestTheFirstConnectToAStoppedReplicaFailsAtOnce(t *testing.T) {
	var frozen atomic.Bool
	frozen.Store(true)
	asPeer(t, func() byte {
		if frozen.Load() {
			return 'T'
		}
		return 0
	})
	never := make(chan struct{})
	addr, _ := slowReplica(t, t.TempDir(), "r", never, never)
	cc, ctx := replicasClient(t, addr)
	callCtx, cancel := context.WithTimeout(ctx, underOldWait)
	defer cancel()
	asked := time.Now()
	_, err := healthpb.NewHealthClient(cc).Check(callCtx, &healthpb.HealthCheckRequest{})
	t.Logf("the first call failed after %v: %v", time.Since(asked).Round(time.Millisecond), err)
	if !Unreachable(err) || !NotAnswering(err) || !strings.Contains(status.Convert(err).Message(), "is stopped") {
		t.Fatalf("the first call to a stopped replica, within %v: %v; want %s, its process stopped", underOldWait, err, NoReplicaReachable)
	}
	frozen.Store(false)
	waitAnswered(t, cc, ctx)
}

// A replica whose process runs but leaves health checks unanswered (a
// starved or busy process: its goroutine here spins, as one wanting the
// CPU does), with no other call answered on the connection: the long
// call on it was ended as hung after ProbeTimeout. The process's CPU
// time grew while the check waited, so it runs: the call waits on, and
// is answered. No time is asserted: the test waits for a first check to
// end unanswered and a second to come (made only once the first was
// judged), then has the replica answer.
func TestAStarvedReplicaThatRunsIsNotHung(t *testing.T) {
	asPeer(t, func() byte { return 0 })
	spin := make(chan struct{})
	var spun sync.WaitGroup
	spun.Add(1)
	go func() {
		defer spun.Done()
		for {
			select {
			case <-spin:
				return
			default:
			}
		}
	}()
	defer func() { close(spin); spun.Wait() }()
	finish := make(chan struct{})
	addr, checks, checked := serveSlowChecks(t, finish)
	cc, ctx := replicasClient(t, addr)
	long := make(chan error, 1)
	go func() { long <- cc.Invoke(ctx, slowMethod, &emptypb.Empty{}, &emptypb.Empty{}) }()
	bound := time.After(ProbeAfter + 2*ProbeTimeout + 60*time.Second)
	for _, what := range []<-chan struct{}{checks, checked, checks} {
		select {
		case <-what:
		case <-bound:
			t.Fatal("no first check, or it did not end, or no second came")
		case err := <-long:
			t.Fatalf("the long call on a replica whose process runs: %v, want it answered", err)
		}
	}
	close(finish)
	if err := <-long; err != nil {
		t.Fatalf("the long call on a replica whose process runs: %v, want it answered", err)
	}
}

// waitAnswered waits for a call through cc to be answered again: the
// replica runs again (SIGCONT).
func waitAnswered(t *testing.T, cc *grpc.ClientConn, ctx context.Context) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(callCtx, &healthpb.HealthCheckRequest{})
		return err
	})
}
