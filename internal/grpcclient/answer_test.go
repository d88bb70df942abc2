package grpcclient

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// slowMethod is answered by slowReplica only when the call ends.
const slowMethod = "/clawmesh.test.Slow/Wait"

// slowReplica serves health and slowMethod on a socket of dir behind a
// relay that holds what it carries, both ways, from the closing of
// freeze to that of thaw (a stopped process: its connection open,
// nothing answered; then SIGCONT). started gets one value a slowMethod
// call that reached it. The test's cleanup closes thaw.
func slowReplica(t *testing.T, dir, name string, freeze, thaw <-chan struct{}) (addr string, started <-chan struct{}) {
	t.Helper()
	in := make(chan struct{}, 16)
	return relayedReplica(t, dir, name, freeze, thaw, func(_ any, ss grpc.ServerStream) error {
		var req emptypb.Empty
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		in <- struct{}{}
		<-ss.Context().Done()
		return ss.Context().Err()
	}), in
}

// relayedReplica serves health and handler (every method but health's)
// on dir/name.sock, behind a relay at dir/name.front.sock that holds
// what it carries, both ways, from the closing of freeze to that of thaw
// (a stopped process: its connection open, nothing answered; then
// SIGCONT). It returns the relay's path; both stop when the test ends.
func relayedReplica(t *testing.T, dir, name string, freeze, thaw <-chan struct{}, handler grpc.StreamHandler) string {
	t.Helper()
	srv := grpcserver.New(zap.NewNop(), time.Second, grpc.UnknownServiceHandler(handler))
	srv.SetServing()
	sock := filepath.Join(dir, name+".sock")
	lis, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx, lis) //nolint:errcheck // ends with ctx
	}()
	t.Cleanup(func() { stop(); <-done })
	front := testenv.StartRelay(t, filepath.Join(dir, name+".front.sock"), sock, func() testenv.RelayHook {
		return func(bool, []byte) bool {
			select {
			case <-freeze:
				<-thaw
			default:
			}
			return true
		}
	})
	return front.Path
}

// A replica that stops with a call in flight on the client's connection
// to it, and a call made on that connection right after: both waited for
// the connection's keepalive (up to 15 s after the last frame read) and
// failed with its words ("keepalive ping failed to receive ACK within
// timeout"), whatever their deadline. They now fail once the replica
// leaves a health check on that connection unanswered, Unavailable with
// a dependency reason, saying it is stopped or hung; the next call
// fails at once, every replica being hung. No time is asserted; the
// bound only stops a hang.
func TestCallsOnAHungReplicasConnectionEndWhenItDoesNotAnswer(t *testing.T) {
	freeze, thaw := make(chan struct{}), make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { close(thaw) }) }
	// Before the relay's cleanup, which waits for what it holds.
	defer resume()
	addr, started := slowReplica(t, t.TempDir(), "r", freeze, thaw)
	cc, ctx := replicasClient(t, addr)
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	slow := func(out chan<- error) {
		out <- cc.Invoke(ctx, slowMethod, &emptypb.Empty{}, &emptypb.Empty{})
	}
	inFlight, after := make(chan error, 1), make(chan error, 1)
	go slow(inFlight)
	<-started
	close(freeze)
	frozeAt := time.Now()
	go slow(after)
	bound := time.After(KeepaliveTime + KeepaliveTimeout + 30*time.Second)
	for name, ch := range map[string]chan error{"the call in flight": inFlight, "the call made after": after} {
		select {
		case err := <-ch:
			st := status.Convert(err)
			reason, _ := rpcerr.Details(st)
			t.Logf("%s failed %v after the stop: %v", name, time.Since(frozeAt).Round(time.Millisecond), err)
			if st.Code() != codes.Unavailable || reason != rpcerr.ReasonDependency || !strings.Contains(st.Message(), "stopped or hung") {
				t.Errorf("%s on a stopped replica: %v (reason %q), want Unavailable, a dependency, stopped or hung", name, err, reason)
			}
		case <-bound:
			t.Fatalf("%s on a stopped replica still waits", name)
		}
	}
	next := time.Now()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	t.Logf("the next call failed after %v: %v", time.Since(next).Round(time.Millisecond), err)
	if !Unreachable(err) || !strings.Contains(status.Convert(err).Message(), "stopped or hung") {
		t.Errorf("a call once the only replica is hung: %v, want %s, stopped or hung", err, NoReplicaReachable)
	}

	// Once it runs again, a health check answers and calls are taken.
	resume()
	resumed := time.Now()
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(callCtx, &healthpb.HealthCheckRequest{})
		return err
	})
	t.Logf("answered again %v after the replica resumed", time.Since(resumed).Round(time.Millisecond))
}

// Of two replicas one stops with a call in flight on it: the call fails
// saying so, and the calls after go to the other replica (none picked
// on the stopped one, whose calls would have waited for the keepalive).
func TestCallsLeaveAHungReplicaForOneThatAnswers(t *testing.T) {
	dir := t.TempDir()
	freeze, thaw, never := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(thaw)
	a, startedA := slowReplica(t, dir, "a", freeze, thaw)
	b, _ := slowReplica(t, dir, "b", never, never)
	cc, ctx := replicasClient(t, a+","+b)
	client := healthpb.NewHealthClient(cc)
	// Slow calls until one is in flight on a.
	inFlight := make(chan error, 8)
	for i := 0; ; i++ {
		go func() { inFlight <- cc.Invoke(ctx, slowMethod, &emptypb.Empty{}, &emptypb.Empty{}) }()
		select {
		case <-startedA:
		case <-time.After(100 * time.Millisecond):
			if i < 6 {
				continue
			}
			t.Fatal("no call reached replica a")
		}
		break
	}
	close(freeze)
	frozeAt := time.Now()
	select {
	case err := <-inFlight:
		t.Logf("the call in flight on a failed %v after its stop: %v", time.Since(frozeAt).Round(time.Millisecond), err)
		if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), a+" did not answer") {
			t.Fatalf("the call in flight on the stopped replica: %v", err)
		}
	case <-time.After(KeepaliveTime + KeepaliveTimeout + 30*time.Second):
		t.Fatal("the call in flight on the stopped replica still waits")
	}
	for i := range 20 {
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := client.Check(callCtx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call %d with replica b serving: %v", i, err)
		}
	}
}
