package grpcclient

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// spinning is a replica whose handlers spin (a livelock, or a process
// busy to the last of its CPU) from the closing of from until release
// is closed: its health checks of grpcserver.Calls and its calls are
// answered only then, its name to a call. Its health stream says it
// serves, so it is picked.
type spinning struct {
	healthpb.UnimplementedHealthServer
	from, release   <-chan struct{}
	checks, checked chan struct{}
}

func (s *spinning) spins() bool {
	select {
	case <-s.from:
		return true
	default:
		return false
	}
}

// spin runs until release or ctx's end, whichever first.
func (s *spinning) spin(ctx context.Context) error {
	for {
		select {
		case <-s.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
	}
}

func (s *spinning) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if !s.spins() {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	s.checks <- struct{}{}
	err := s.spin(ctx)
	s.checked <- struct{}{}
	if err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (s *spinning) Watch(_ *healthpb.HealthCheckRequest, ws healthpb.Health_WatchServer) error {
	if err := ws.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	<-ws.Context().Done()
	return nil
}

// serveSpinning serves a spinning replica named name on a socket of
// dir; started gets one value a call that reached it.
func serveSpinning(t *testing.T, dir, name string, from, release <-chan struct{}) (addr string, started, checks, checked <-chan struct{}) {
	t.Helper()
	s := &spinning{from: from, release: release, checks: make(chan struct{}, 64), checked: make(chan struct{}, 64)}
	in := make(chan struct{}, 64)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var req emptypb.Empty
		if err := ss.RecvMsg(&req); err != nil {
			return err
		}
		if !s.spins() {
			return ss.SendMsg(wrapperspb.String(name))
		}
		in <- struct{}{}
		if err := s.spin(ss.Context()); err != nil {
			return err
		}
		return ss.SendMsg(wrapperspb.String(name))
	}))
	healthpb.RegisterHealthServer(srv, s)
	sock := filepath.Join(dir, name+".sock")
	serveUntilCleanup(t, srv, sock)
	return sock, in, s.checks, s.checked
}

// leftWithin bounds a call that must go to the replica that answers: a
// call picked on the spinning one waits until it is released, for ever.
// A bound against a hang, not a measure.
const leftWithin = 2 * ProbeTimeout

// Of two replicas, a's handlers spin (a livelock: its process runs and
// answers nothing) with a call in flight on it. Its process's CPU time
// grows while its checks go unanswered, as a starved process's does, so
// it is not hung and its call waits on, for its own deadline: the
// client cannot tell a process that spins from one starved or busy, and
// ending the calls of a starved one was the sixty-fourth round's fault.
// But new calls went to it in turn, each waiting for its own deadline,
// while b answered at once: of the calls after the first check's
// verdict, each under leftWithin, the one picked on a failed. A replica that
// runs and answers nothing is now left for one that answers (it is
// still picked when none does): each is answered by b. The call in
// flight on a is not ended; once a answers again it is picked again.
func TestAReplicaThatRunsAndAnswersNothingIsLeftForOneThatAnswers(t *testing.T) {
	dir := t.TempDir()
	from, release, never := make(chan struct{}), make(chan struct{}), make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	a, started, checks, checked := serveSpinning(t, dir, "a", from, release)
	b := namedReplica(t, dir, "b", never, never)
	newFakePeers(t, a, b)
	cc, ctx := replicasClient(t, a+","+b)
	bothAnswer(t, ctx, cc)
	close(from)
	long := make(chan error, 8)
	for i := 0; ; i++ {
		go func() {
			name, err := nameOf(ctx, cc, time.Hour)
			if err == nil && name != "a" {
				return
			}
			long <- err
		}()
		select {
		case <-started:
		case <-time.After(100 * time.Millisecond):
			if i < 20 {
				continue
			}
			t.Fatal("no call reached replica a")
		}
		break
	}
	bound := time.After(ProbeAfter + 2*ProbeTimeout + 60*time.Second)
	for _, what := range []<-chan struct{}{checks, checked, checks} {
		select {
		case <-what:
		case <-bound:
			t.Fatal("no first check on a, or it did not end, or no second came")
		case err := <-long:
			t.Fatalf("the call in flight on a replica that runs: %v, want it to wait", err)
		}
	}
	for i := range 4 {
		name, err := nameOf(ctx, cc, leftWithin)
		if err != nil || name != "b" {
			t.Fatalf("call %d with a answering nothing: %q, %v; want b within %v", i, name, err, leftWithin)
		}
	}
	select {
	case err := <-long:
		t.Fatalf("the call in flight on a replica that runs: %v, want it to wait", err)
	default:
	}
	close(release)
	released = true
	if err := <-long; err != nil {
		t.Fatalf("the call in flight on a, once it answers: %v", err)
	}
	seen := false
	for range 20 {
		name, err := nameOf(ctx, cc, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		seen = seen || name == "a"
	}
	if !seen {
		t.Error("a answers again, and no call of 20 went to it")
	}
}
