package grpcclient

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
)

// fastMethod is answered by slowChecks at once.
const fastMethod = "/clawmesh.test.Fast/Echo"

// slowChecks is a replica that answers its calls but leaves each unary
// health check of grpcserver.Calls unanswered until it ends (a process
// starved or busy, whose check's answer comes late): checks gets one
// value a check that reached it, checked one a check that ended. Its
// health stream says it serves, so it is picked. slowMethod is answered
// when finish is closed (or fails when its call ends), fastMethod at
// once.
type slowChecks struct {
	healthpb.UnimplementedHealthServer
	checks, checked chan struct{}
}

func (s *slowChecks) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	s.checks <- struct{}{}
	<-ctx.Done()
	s.checked <- struct{}{}
	return nil, ctx.Err()
}

func (s *slowChecks) Watch(_ *healthpb.HealthCheckRequest, ws healthpb.Health_WatchServer) error {
	if err := ws.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	<-ws.Context().Done()
	return nil
}

func serveSlowChecks(t *testing.T, finish <-chan struct{}) (addr string, checks, checked <-chan struct{}) {
	t.Helper()
	// Room for every check a test waits through: a handler never blocks.
	s := &slowChecks{checks: make(chan struct{}, 64), checked: make(chan struct{}, 64)}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var req emptypb.Empty
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		if m, _ := grpc.MethodFromServerStream(ss); m == fastMethod {
			return ss.SendMsg(&emptypb.Empty{})
		}
		select {
		case <-finish:
			return ss.SendMsg(&emptypb.Empty{})
		case <-ss.Context().Done():
			return ss.Context().Err()
		}
	}))
	healthpb.RegisterHealthServer(srv, s)
	sock := filepath.Join(t.TempDir(), "starved.sock")
	serveUntilCleanup(t, srv, sock)
	return sock, s.checks, s.checked
}

// A replica that leaves a health check unanswered for ProbeTimeout while
// a long call waits on it, but answers other calls on that connection
// meanwhile, runs (starved or busy): it is not stopped or hung. The long
// call was ended as hung all the same, and every call after it failed
// at once. What was heard on the connection since the check began now
// counts against the hang: the long call runs on, and is answered.
// No time is asserted: once the first check has ended unanswered, the
// test waits for the next one (made only after the first was judged),
// then has the replica answer the long call.
func TestAReplicaAnsweringCallsIsNotHungForAnUnansweredCheck(t *testing.T) {
	finish := make(chan struct{})
	addr, checks, checked := serveSlowChecks(t, finish)
	cc, ctx := replicasClient(t, addr)
	if err := cc.Invoke(ctx, fastMethod, &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	long := make(chan error, 1)
	go func() { long <- cc.Invoke(ctx, slowMethod, &emptypb.Empty{}, &emptypb.Empty{}) }()

	// The first check reaches the replica once the long call has waited
	// ProbeAfter; calls are answered while it waits.
	bound := time.After(ProbeAfter + ProbeTimeout + 60*time.Second)
	select {
	case <-checks:
	case <-bound:
		t.Fatal("no health check came")
	}
	stop := make(chan struct{})
	fast := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				fast <- nil
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := cc.Invoke(ctx, fastMethod, &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
				fast <- err
				return
			}
		}
	}()
	for _, what := range []<-chan struct{}{checked, checks} {
		select {
		case <-what:
		case <-bound:
			t.Fatal("the first check did not end, or no second came")
		}
		// The first check has ended unanswered: no more calls, so that
		// the next check is made.
		select {
		case <-stop:
		default:
			close(stop)
		}
	}
	if err := <-fast; err != nil {
		t.Errorf("a call while the check waited: %v", err)
	}
	close(finish)
	if err := <-long; err != nil {
		t.Fatalf("the long call on a replica that answers calls: %v, want it answered", err)
	}
	if err := cc.Invoke(ctx, fastMethod, &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
		t.Fatalf("a call after: %v", err)
	}
}

// serveUntilCleanup serves srv on a new socket at sock until the test
// ends.
func serveUntilCleanup(t *testing.T, srv *grpc.Server, sock string) {
	t.Helper()
	lis, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis) //nolint:errcheck // ends with Stop
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
}
