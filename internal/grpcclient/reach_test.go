package grpcclient

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// With every sandbox replica gone for good (its socket missing, no
// process restarting it) a call through DialReplicas with a deadline
// waited out the whole deadline for a replica that serves: a tool
// call's two minutes, an hour here, so the test's bound ran out first.
// It now fails once no address has connected for RestartGrace,
// Unavailable and naming a dependency, the call and the stream waiting
// alike. One address fared otherwise before (dialled as by Dial: a
// call failed at once with gRPC's connect error); it is now a set of
// one, and fails the same way.
func TestCallsFailOnceNoReplicaIsReachable(t *testing.T) {
	dir := t.TempDir()
	gone := filepath.Join(dir, "gone.sock")
	for name, addr := range map[string]string{
		"one address":   gone,
		"two addresses": gone + "," + filepath.Join(dir, "gone.1.sock"),
	} {
		t.Run(name, func(t *testing.T) {
			cc, ctx := replicasClient(t, addr)
			for kind, call := range healthCalls(cc, ctx) {
				done := make(chan error, 1)
				go func() { done <- call() }()
				select {
				case err := <-done:
					st := status.Convert(err)
					reason, _ := rpcerr.Details(st)
					if st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), NoReplicaReachable) || reason != rpcerr.ReasonDependency {
						t.Fatalf("a %s with every replica gone: %v (reason %q)", kind, err, reason)
					}
					t.Logf("%s: %v", kind, err)
				case <-time.After(RestartGrace + 30*time.Second):
					t.Fatalf("a %s with an hour's deadline and every replica gone still waits after %v", kind, RestartGrace+30*time.Second)
				}
			}
		})
	}
}

// A replica that is hung (stopped: its socket accepts, in the kernel's
// backlog, and nothing answers) fails each connect only at its
// deadline, 2 s after the attempt began. It was counted away from
// that failure, so calls waited 2 s past the grace (5 s, as long as
// plugins/list's whole deadline), and the error said only gRPC's
// "error reading server preface: ... use of closed network
// connection". It is away from the attempt's start now, and the error
// says the replica accepts but does not answer.
func TestAHungReplicaIsAwayFromItsFirstFailedConnectsStart(t *testing.T) {
	t0 := time.Now()
	now := t0
	r := newReachability(RestartGrace, func() {})
	defer r.close()
	r.now = func() time.Time { return now }
	rc := &reach{}
	r.conns[rc] = struct{}{}
	r.update(rc, balancer.SubConnState{ConnectivityState: connectivity.Connecting})
	now = now.Add(2 * time.Second)
	r.update(rc, balancer.SubConnState{ConnectivityState: connectivity.TransientFailure, ConnectionError: fmt.Errorf("error reading server preface: %w", net.ErrClosed)})
	r.update(rc, balancer.SubConnState{ConnectivityState: connectivity.Connecting})
	now = t0.Add(RestartGrace)
	err := r.unreachable()
	if err == nil {
		t.Fatalf("a replica whose connects have hung since %v is not unreachable %v later", t0.Format(time.StampMilli), RestartGrace)
	}
	t.Log(err)
}

// The same through a client: a socket that accepts and a process that
// never answers. The call's error names the socket and says it does
// not answer.
func TestACallToAHungReplicaSaysItDoesNotAnswer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "hung.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close() // never accepts: connects wait in the backlog
	cc, ctx := replicasClient(t, sock)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		done <- err
	}()
	select {
	case err := <-done:
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), NoReplicaReachable) || !strings.Contains(st.Message(), sock+" accepts connections but did not answer") {
			t.Fatalf("a call to a hung replica: %v", err)
		}
		t.Logf("failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(RestartGrace + 30*time.Second):
		t.Fatalf("a call with an hour's deadline to a hung replica still waits after %v", RestartGrace+30*time.Second)
	}
}

// A call without a deadline while no replica comes back waits no
// longer than one with a deadline of RestartGrace would, and fails
// Unavailable naming a dependency. It used to fail at once with gRPC's
// connect error, which names nothing (and so did a call while the only
// replica restarted: grpcserver's TestACallWaitsForAReplicaRestarting).
func TestACallWithoutADeadlineEndsWhenNoReplicaComes(t *testing.T) {
	cc, err := DialReplicas(filepath.Join(t.TempDir(), "gone.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for kind, call := range healthCalls(cc, context.Background()) {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			st := status.Convert(err)
			reason, _ := rpcerr.Details(st)
			if st.Code() != codes.Unavailable || reason != rpcerr.ReasonDependency ||
				!strings.HasPrefix(st.Message(), NoReplicaServes) && !strings.HasPrefix(st.Message(), NoReplicaReachable) {
				t.Fatalf("a %s without a deadline, no replica there: %v (reason %q)", kind, err, reason)
			}
			t.Logf("%s: %v", kind, err)
		case <-time.After(RestartGrace + 30*time.Second):
			t.Fatalf("a %s without a deadline and no replica there still waits after %v", kind, RestartGrace+30*time.Second)
		}
	}
}

// replicasClient dials addr with DialReplicas, closed at the test's end,
// and gives the test's calls a context of an hour: what they wait for is
// the client's own bound, which the tests read.
func replicasClient(t *testing.T, addr string) (*grpc.ClientConn, context.Context) {
	t.Helper()
	cc, err := DialReplicas(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	return cc, ctx
}

// healthCalls are a unary health check and a health stream's start on
// cc under ctx, by kind: the two ways a call waits for a replica.
func healthCalls(cc *grpc.ClientConn, ctx context.Context) map[string]func() error {
	client := healthpb.NewHealthClient(cc)
	return map[string]func() error{
		"call": func() error {
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		},
		"stream": func() error {
			_, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			return err
		},
	}
}
