// Package servicetest starts a service process's Run in a test, as the
// launcher would, against a config service that gives no answer.
package servicetest

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/service"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// Started is a service process run by StartWithHungConfig.
type Started struct {
	Conn *grpc.ClientConn // to the process's own socket
	// Hung is config's socket: it listens and never accepts (a stopped
	// process's); serving on it lets the waiting connections through.
	Hung net.Listener
	Done <-chan error // Run's result
	Stop context.CancelFunc
	name string
}

// StartWithHungConfig runs spec's process (service.Run) in a data
// directory of its own, on the test's NATS server with a bus seed of its
// own, its config address a socket that never accepts, and its session
// address a socket nobody listens on.
func StartWithHungConfig(t *testing.T, name string, spec service.Spec) *Started {
	t.Helper()
	dir := t.TempDir()
	cfgSock := filepath.Join(dir, "config.sock")
	hung, err := net.Listen("unix", cfgSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ZEROCLAW_DATA_DIR", dir)
	t.Setenv(service.EnvNATSURL, testenv.NATS(t))
	t.Setenv(bus.EnvSeed, string(seed))

	sock := filepath.Join(dir, name+".sock")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, spec, []string{"--listen", sock, "--config-addr", cfgSock, "--session-addr", filepath.Join(dir, "session.sock")})
	}()
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &Started{Conn: cc, Hung: hung, Done: done, Stop: cancel, name: name}
}

// Health asks the process's health and returns its status and the
// reason its trailer gives; the test fails if the process has stopped.
func (s *Started) Health(t *testing.T) (healthpb.HealthCheckResponse_ServingStatus, string, error) {
	t.Helper()
	select {
	case err := <-s.Done:
		t.Fatalf("%s stopped: %v", s.name, err)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var md metadata.MD
	resp, err := healthpb.NewHealthClient(s.Conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
	return resp.GetStatus(), strings.Join(md.Get(grpcserver.ReasonTrailer), "; "), err
}

// Alive reports whether the process answers its liveness name
// (grpcserver.Liveness, what a pod's probes ask) SERVING.
func (s *Started) Alive(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(s.Conn).Check(ctx, &healthpb.HealthCheckRequest{Service: grpcserver.Liveness})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}
