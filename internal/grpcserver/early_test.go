package grpcserver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// startEarly makes a server answering on a socket of its own from the
// start (ServeEarly), and a client of that socket; it returns the
// listener to give Serve.
func startEarly(t *testing.T) (srv *grpcserver.Server, lis net.Listener, sock string, cc *grpc.ClientConn) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cm-e-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock = filepath.Join(dir, "p.sock")
	srv = grpcserver.New(testenv.Logger(t), time.Second)
	if lis, err = grpcserver.Listen(sock); err != nil {
		t.Fatal(err)
	}
	lis = srv.ServeEarly(lis)
	if cc, err = grpcclient.Dial(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return srv, lis, sock, cc
}

// registerAnswering registers on srv a config service whose Live
// answers at once.
func registerAnswering(srv *grpcserver.Server) {
	f := &fake{entered: make(chan struct{}, 64), release: make(chan struct{})}
	close(f.release)
	configv1.RegisterConfigServiceServer(srv.GRPC, f)
}

// serve runs srv's Serve on lis until stop, which waits for it to
// return and fails the test if it failed.
func serve(t *testing.T, srv *grpcserver.Server, lis net.Listener) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("serve: %v", err)
		}
	}
}

// The start's server answers health and refuses other calls with the
// reason; once the process serves, the same listener serves its services
// (a client's connection to the start's server is dropped and made
// again), and a start that never served leaves no socket behind.
func TestEarlyHealthHandsTheListenerOver(t *testing.T) {
	srv, lis, sock, cc := startEarly(t)
	srv.SetStarting("waiting for the database")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while starting: %v, %v", resp, err)
	}
	_, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "starting: waiting for the database" {
		t.Fatalf("a call while starting: %v", err)
	}

	registerAnswering(srv)
	srv.SetServing()
	stop := serve(t, srv, lis)
	testenv.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		resp, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
		if err != nil {
			return err
		}
		if resp.GetRevision() != 7 {
			return errors.New("not the process's service")
		}
		return nil
	})
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health once serving: %v, %v", resp, err)
	}
	stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after the stop: %v", err)
	}

	// A start that fails before it serves: Shutdown closes the listener.
	srv2 := grpcserver.New(testenv.Logger(t), time.Second)
	lis2, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv2.ServeEarly(lis2)
	srv2.Shutdown()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after a failed start: %v", err)
	}
}

// A start that waits on another process (the config service, hung)
// answers the liveness name SERVING meanwhile: it is alive, and
// restarting it mends nothing. Kubernetes' startup probe asks that name,
// and restarted such a pod every 120 s for as long as config hung. The
// overall name stays NOT_SERVING with the reason, and a start that goes
// on to its own steps is not alive in that sense until it serves.
func TestWaitingOnAnotherProcessIsAlive(t *testing.T) {
	srv, lis, _, cc := startEarly(t)
	t.Cleanup(func() { srv.Shutdown(); lis.Close() })
	hc := healthpb.NewHealthClient(cc)
	check := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("health %q: %v", name, err)
		}
		return resp.GetStatus()
	}
	srv.SetWaitingOn("waiting for the config service")
	if got := check(grpcserver.Liveness); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness while waiting on config: %v, want SERVING", got)
	}
	if got := check(""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while waiting on config: %v, want NOT_SERVING", got)
	}
	if r := srv.Reason(); r != "starting: waiting for the config service" {
		t.Fatalf("reason %q", r)
	}
	srv.SetStarting("setting up its services")
	if got := check(grpcserver.Liveness); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("liveness once the start goes on: %v, want NOT_SERVING", got)
	}
}

// A call while the start waits on another process names it as a
// dependency, so that the gateway tells the client what it waits for
// ("session: starting: waiting for the config service") rather than
// "session unavailable", as if the process itself were down. Its own
// steps (the database, the bus) stay a bare Unavailable.
func TestEarlyCallNamesTheProcessWaitedOn(t *testing.T) {
	srv, lis, _, cc := startEarly(t)
	t.Cleanup(func() { srv.Shutdown(); lis.Close() })
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
		return err
	}
	srv.SetWaitingOn("waiting for the config service")
	err := call()
	st := status.Convert(err)
	if reason, _ := rpcerr.Details(st); st.Code() != codes.Unavailable || reason != rpcerr.ReasonDependency ||
		st.Message() != "starting: waiting for the config service" {
		t.Fatalf("a call while waiting on config: %v (reason %q)", err, reason)
	}
	srv.SetStarting("setting up its services")
	err = call()
	st = status.Convert(err)
	if reason, _ := rpcerr.Details(st); st.Code() != codes.Unavailable || reason != "" {
		t.Fatalf("a call while setting up: %v (reason %q)", err, reason)
	}
}

// A socket the launcher handed over is held (HoldEarly): its calls wait
// for the process to serve them, until the start asks it to answer
// (AnswerEarly, a wait on config that lasts), and then they are
// answered with the reason; Serve takes the listener over as from
// ServeEarly.
func TestHeldListenerAnswersWhenAsked(t *testing.T) {
	dir, err := os.MkdirTemp("", "cm-h-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "p.sock")
	srv := grpcserver.New(testenv.Logger(t), time.Second)
	lis, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	lis = srv.HoldEarly(lis)
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	srv.SetWaitingOn("waiting for the config service")

	// Held: a call gets no answer (its own deadline ends it).
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true))
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call on the held socket: %v, want no answer", err)
	}

	srv.AnswerEarly()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "starting: waiting for the config service" {
		t.Fatalf("a call once the held socket answers: %v", err)
	}

	registerAnswering(srv)
	srv.SetServing()
	stop := serve(t, srv, lis)
	testenv.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		_, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
		return err
	})
	srv.AnswerEarly() // once it serves: nothing
	stop()
}

// The start's server answers reflection too: grpcurl finds a method's
// types by reflection before it calls, and while a process started it
// failed every call there, health included ("failed to query for
// service descriptor \"grpc.health.v1.Health\": starting: waiting for
// the database"), so `grpcurl ... grpc.health.v1.Health/Check` could not
// see the NOT_SERVING docs/design.md promises. It lists what answers
// now (health) and resolves every type the binary holds, so a call of a
// service not yet served reaches the start's server and says why.
func TestEarlyServerAnswersReflection(t *testing.T) {
	srv, _, _, cc := startEarly(t)
	srv.SetStarting("waiting for the database")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection while starting: %v", err)
		}
		return resp
	}
	var names []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, healthpb.Health_ServiceDesc.ServiceName) {
		t.Fatalf("services listed while starting: %v", names)
	}
	resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: configv1.ConfigService_ServiceDesc.ServiceName,
	}})
	if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("the config service's types while starting: %v", resp.GetErrorResponse())
	}
}

// A client that connects to the start's server and sends nothing (a
// hung or stopped client, a probe cut off mid-connect) does not hold the
// process's start: grpc's Stop waits for every connection still in its
// handshake, for up to its connection timeout (120 s), so Serve did not
// begin serving, nor Shutdown end, until the silent client's timeout.
func TestSilentEarlyClientDoesNotHoldTheStart(t *testing.T) {
	srv, lis, sock, cc := startEarly(t)
	srv.SetStarting("waiting for the database")
	silent, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Answered on a later connection: the silent one was accepted
	// before it, and is in its handshake.
	hc := healthpb.NewHealthClient(cc)
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while starting: %v, %v", resp, err)
	}

	registerAnswering(srv)
	srv.SetServing()
	stop := serve(t, srv, lis)
	if _, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true)); err != nil {
		// The start's server's Unavailable is retried: the client
		// reconnects to whichever server takes the connection.
		testenv.Eventually(t, 25*time.Second, 10*time.Millisecond, func() error {
			_, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
			return err
		})
	}
	stop()
}

// Between SetServing and Serve's taking the listener over, the start's
// server still answers and refuses every call "starting"; its health
// answered SERVING from the state it shares with the process's own, so a
// readiness check that asked then (the launcher's, a client of one
// address) sent its first calls to be refused. It says NOT_SERVING with
// a reason until the process's own server answers (Liveness aside).
func TestEarlyHealthIsNotServingBeforeServeTakesOver(t *testing.T) {
	srv, lis, _, cc := startEarly(t)
	registerAnswering(srv)
	srv.SetServing()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)
	var trailer metadata.MD
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		_, callErr := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
		t.Fatalf("health registered, not yet served: %v, %v (while a call gets %v)", resp, err, callErr)
	}
	if got := trailer.Get(grpcserver.ReasonTrailer); len(got) != 1 || !strings.HasPrefix(got[0], "starting") {
		t.Fatalf("its reason: %q", got)
	}
	if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: grpcserver.Liveness}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness registered, not yet served: %v, %v", resp, err)
	}

	stop := serve(t, srv, lis)
	defer stop()
	testenv.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health once served: %v", resp.GetStatus())
		}
		return nil
	})
	// SERVING is the process's own server's answer: calls reach it.
	if _, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{}); err != nil {
		t.Fatalf("a call once health says SERVING: %v", err)
	}
}
