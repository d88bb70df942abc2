package service

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// A step Register says (the sandbox's compiles) is health's reason, on a
// socket the launcher handed over too: held until the process served,
// that socket answered no health check for the whole of a long start,
// and the launcher saw no step of it.
func TestStartingStepsAnswerOnAHandedSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{Log: zap.NewNop(), Server: grpcserver.New(zap.NewNop(), 0)}
	defer env.Server.Shutdown()
	env.Server.HoldEarly(lis) // as Run does with a socket passed to it
	env.Starting("compiling plugin echo (tool world)")

	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Bound)
	defer cancel()
	var md metadata.MD
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md), grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("health during a step of the start: %v", err)
	}
	reason := strings.Join(md.Get(grpcserver.ReasonTrailer), "; ")
	if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING || reason != "starting: compiling plugin echo (tool world)" {
		t.Fatalf("health during a step of the start: %v, %q", resp.GetStatus(), reason)
	}
}
