package main

import (
	"context"
	"fmt"
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

// A replica started while the config service was hung gave it 15 s and
// exited, to be started again and do the same for as long as config was
// hung. It now waits, health saying why (no plugin is loaded on settings
// config did not give), and a stop ends the wait.
func TestStartWaitsForAHungConfig(t *testing.T) {
	dir := t.TempDir()
	cfgSock := filepath.Join(dir, "config.sock")
	hung, err := net.Listen("unix", cfgSock) // never accepts: a stopped process
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
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

	sock := filepath.Join(dir, "plugin-sandbox.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, spec(), []string{"--listen", sock, "--config-addr", cfgSock, "--session-addr", filepath.Join(dir, "session.sock")})
	}()
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	const waiting = "starting: waiting for the config service"
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		select {
		case err := <-done:
			t.Fatalf("plugin-sandbox stopped: %v", err)
		default:
		}
		hctx, hcancel := context.WithTimeout(context.Background(), time.Second)
		defer hcancel()
		var md metadata.MD
		resp, err := healthpb.NewHealthClient(cc).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
		if err != nil {
			return err
		}
		if reason := strings.Join(md.Get(grpcserver.ReasonTrailer), "; "); resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING || reason != waiting {
			return fmt.Errorf("health with config hung: %v %q, want NOT_SERVING %q", resp.GetStatus(), reason, waiting)
		}
		return nil
	})
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "stopped while waiting for it") {
		t.Fatalf("a stop while waiting for config: %v", err)
	}
}
