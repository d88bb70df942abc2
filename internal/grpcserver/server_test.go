package grpcserver_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/internal/unixsock"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// fake serves Live by waiting for release (or panicking on demand); the
// config contract is only a convenient service to register.
type fake struct {
	configv1.UnimplementedConfigServiceServer
	entered chan struct{}
	release chan struct{}
}

func (f *fake) Live(ctx context.Context, _ *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	f.entered <- struct{}{}
	select {
	case <-f.release:
		return &configv1.LiveResponse{Revision: 7}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *fake) Get(context.Context, *configv1.GetRequest) (*configv1.GetResponse, error) {
	panic("handler bug")
}

func (f *fake) Set(context.Context, *configv1.SetRequest) (*configv1.SetResponse, error) {
	return nil, fmt.Errorf("write /data/secret/path: %w", &os.PathError{Op: "write", Path: "/data/x", Err: syscall.ENOSPC})
}

func (f *fake) SetMany(context.Context, *configv1.SetManyRequest) (*configv1.SetManyResponse, error) {
	return nil, fmt.Errorf("rename into /data/workspaces: %w", &os.LinkError{Op: "rename", Old: "/data/a", New: "/data/b", Err: syscall.EROFS})
}

func start(t *testing.T, drain time.Duration) (*grpcserver.Server, *grpc.ClientConn, *fake, context.CancelFunc, chan error) {
	t.Helper()
	srv := grpcserver.New(testenv.Logger(t), drain)
	f := &fake{entered: make(chan struct{}, 4), release: make(chan struct{})}
	configv1.RegisterConfigServiceServer(srv.GRPC, f)
	path := filepath.Join(t.TempDir(), "s.sock")
	var lis net.Listener
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetServing(configv1.ConfigService_ServiceDesc.ServiceName)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	cc, err := grpcclient.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cc.Close() })
	return srv, cc, f, cancel, done
}

func TestHealthAndPanicRecovery(t *testing.T) {
	_, cc, _, _, _ := start(t, time.Second)
	ctx := context.Background()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: configv1.ConfigService_ServiceDesc.ServiceName})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
	_, err = configv1.NewConfigServiceClient(cc).Get(ctx, &configv1.GetRequest{})
	if status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
		t.Fatalf("panic surfaced as %v", err)
	}
	// The process survived the panic and still serves.
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after panic: %v", err)
	}
}

// A handler that failed for want of disk space answers so, as a
// dependency unavailable (the client's to mend, worth another try), with
// no path in it; any other error stays "internal error".
func TestDiskFullIsSaid(t *testing.T) {
	_, cc, _, _, _ := start(t, time.Second)
	_, err := configv1.NewConfigServiceClient(cc).Set(context.Background(), &configv1.SetRequest{})
	st := status.Convert(err)
	if reason, _ := rpcerr.Details(st); st.Code() != codes.Unavailable || reason != rpcerr.ReasonDependency || st.Message() != "no space left on the disk" {
		t.Fatalf("a disk full answered %v", err)
	}
	_, err = configv1.NewConfigServiceClient(cc).SetMany(context.Background(), &configv1.SetManyRequest{})
	st = status.Convert(err)
	if reason, _ := rpcerr.Details(st); st.Code() != codes.Unavailable || reason != rpcerr.ReasonDependency || st.Message() != "the disk is read-only" {
		t.Fatalf("a read-only disk answered %v", err)
	}
}

func TestShutdownDrainsInFlight(t *testing.T) {
	srv, cc, f, cancel, done := start(t, 10*time.Second)
	client := configv1.NewConfigServiceClient(cc)
	result := make(chan error, 1)
	go func() {
		resp, err := client.Live(context.Background(), &configv1.LiveRequest{})
		if err == nil && resp.GetRevision() != 7 {
			err = status.Error(codes.Unknown, "wrong response")
		}
		result <- err
	}()
	testwait.Recv(t, f.entered)
	cancel() // SIGTERM in a service
	// Health turns NOT_SERVING while the call is still running.
	testenv.Eventually(t, 5*time.Second, 10*time.Millisecond, func() error {
		st, _ := srv.Health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			return status.Error(codes.Unknown, "still serving")
		}
		return nil
	})
	close(f.release)
	if err := testwait.Recv(t, result); err != nil {
		t.Fatalf("in-flight call cut by a graceful stop: %v", err)
	}
	if err := testwait.Recv(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestShutdownHardLimit(t *testing.T) {
	_, cc, f, cancel, done := start(t, 200*time.Millisecond)
	go func() { _, _ = configv1.NewConfigServiceClient(cc).Live(context.Background(), &configv1.LiveRequest{}) }()
	testwait.Recv(t, f.entered)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a stuck call kept the server from stopping past its drain limit")
	}
}

// The server's stream workers (streamWorkers, 16) reuse goroutines; they
// must not bound how many calls run at once: calls that find every worker
// busy run on goroutines of their own. 48 calls that each wait for the
// others all get in.
func TestCallsPastTheWorkersRunAtOnce(t *testing.T) {
	_, cc, f, _, _ := start(t, time.Second)
	client := configv1.NewConfigServiceClient(cc)
	const calls = 48
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	results := make(chan error, calls)
	for range calls {
		go func() {
			_, err := client.Live(ctx, &configv1.LiveRequest{})
			results <- err
		}()
	}
	for i := range calls {
		select {
		case <-f.entered:
		case <-ctx.Done():
			t.Fatalf("%d of %d calls running at once; the rest wait for a worker", i, calls)
		}
	}
	close(f.release)
	for range calls {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}

// Liveness answers SERVING while a dependency is down and the process
// name says NOT_SERVING: a liveness probe on the overall name restarted
// every process a minute into a database or bus outage, which a restart
// does not mend (the process reconnects by itself) and which killed the
// turns and staged uploads it held.
func TestLivenessIgnoresDependencies(t *testing.T) {
	srv, cc, _, _, _ := start(t, time.Second)
	hc := healthpb.NewHealthClient(cc)
	ctx := context.Background()
	srv.SetDependency("database", fmt.Errorf("connection refused"))
	for name, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		"":                  healthpb.HealthCheckResponse_NOT_SERVING,
		grpcserver.Liveness: healthpb.HealthCheckResponse_SERVING,
		configv1.ConfigService_ServiceDesc.ServiceName: healthpb.HealthCheckResponse_NOT_SERVING,
	} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != want {
			t.Errorf("health %q with the database down: %v %v, want %v", name, resp.GetStatus(), err, want)
		}
	}
	srv.Shutdown()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: grpcserver.Liveness})
	if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness SERVING after shutdown")
	}
}

// A client that connected and sent nothing does not hold a shutdown
// past its drain limit: grpc's GracefulStop and Stop both wait for a
// connection still in its handshake, for up to grpc's connection
// timeout (120 s), and a SIGTERMed process outlived its drain by as
// much (a pod, its termination grace period, and was killed).
func TestSilentClientDoesNotHoldTheShutdown(t *testing.T) {
	srv := grpcserver.New(testenv.Logger(t), 200*time.Millisecond)
	path := filepath.Join(t.TempDir(), "s.sock")
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetServing()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	silent, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	cc, err := grpcclient.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// Answered on a later connection: the silent one was accepted
	// before it, and is in its handshake.
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a client that sent nothing kept the server from stopping past its drain limit")
	}
}
