package grpcclient

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A peer that stops answering fails the calls in flight on it by the
// connection's keepalive, whatever their own deadline (here none): the
// gateway's session/prompt waits as long as its turn, not forever.
func TestHungPeerFailsCallsInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the keepalive (15 s)")
	}
	dir := t.TempDir()
	srv := grpcserver.New(zap.NewNop(), time.Second)
	srv.SetServing()
	lis, err := grpcserver.Listen(filepath.Join(dir, "server.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go srv.Serve(ctx, lis) //nolint:errcheck // ends with ctx

	// The relay stops relaying altogether once frozen, as a stopped
	// (SIGSTOP) or deadlocked process would: bytes sit in the socket
	// buffers, nothing answers.
	frozen := make(chan struct{})
	front := testenv.StartRelay(t, filepath.Join(dir, "front.sock"), filepath.Join(dir, "server.sock"), func() testenv.RelayHook {
		return func(bool, []byte) bool {
			select {
			case <-frozen:
				return false
			default:
				return true
			}
		}
	})

	cc, err := Dial(front.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// A call that stays in flight: the health watch streams until the
	// status changes.
	w, err := healthpb.NewHealthClient(cc).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := w.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first: %v %v", first, err)
	}
	close(frozen)
	frozeAt := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := w.Recv()
		done <- err
	}()
	select {
	case err := <-done:
		took := time.Since(frozeAt)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("the call in flight ended with %v", err)
		}
		if took < KeepaliveTime {
			t.Fatalf("failed after %v, before any keepalive could have been missed", took)
		}
		t.Logf("call in flight on a hung peer failed after %v (keepalive %v + %v)", took.Round(time.Millisecond), KeepaliveTime, KeepaliveTimeout)
	case <-time.After(KeepaliveTime + KeepaliveTimeout + 15*time.Second):
		t.Fatal("the call in flight on a hung peer never failed")
	}
}
