package service

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
)

// A process whose database accepts connections and never answers (a
// stopped server, a wrong port that something else holds) answered no
// health at all for the minute its start waited, then exited with
// "database not reachable: context deadline exceeded" twice over: probes
// and the gateway's status saw only timeouts. Health answers from the
// moment the process listens, NOT_SERVING with what the start waits for,
// the liveness name too (a startup probe waits), any other call is
// Unavailable, and the start ends naming the database (never its
// password) and how long it waited.
func TestHealthAnswersWhileTheDatabaseHangs(t *testing.T) {
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		hang.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	dir := t.TempDir()
	t.Setenv("ZEROCLAW_DATA_DIR", dir)
	t.Setenv(EnvDatabaseURL, "postgres://someone:s3cret-pass@"+hang.Addr().String()+"/db?sslmode=disable")
	t.Setenv(EnvNATSURL, "nats://127.0.0.1:1")
	old := databaseStartWait
	databaseStartWait = 4 * time.Second
	t.Cleanup(func() { databaseStartWait = old })

	sock := filepath.Join(dir, "hang.sock")
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Spec{
			Name: "hang", Schema: "hang", Migrations: fstest.MapFS{},
			Register: func(context.Context, *Env) error { return nil },
		}, []string{"--listen", sock})
	}()
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	check := func(service string) (*healthpb.HealthCheckResponse, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var md metadata.MD
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.Trailer(&md))
		return resp, strings.Join(md.Get(grpcserver.ReasonTrailer), "; "), err
	}
	for {
		select {
		case err := <-done:
			t.Fatalf("the start ended (%v) with no health answered", err)
		default:
		}
		resp, reason, err := check("")
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING || reason != "starting: waiting for the database" {
			t.Fatalf("health during the start: %v (%q)", resp.GetStatus(), reason)
		}
		break
	}
	if resp, _, err := check(grpcserver.Liveness); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("liveness during the start: %v, %v", resp.GetStatus(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err = cc.Invoke(ctx, "/clawmesh.config.v1.ConfigService/Live", &emptypb.Empty{}, &emptypb.Empty{})
	cancel()
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "starting: waiting for the database" {
		t.Fatalf("a call during the start: %v", err)
	}
	err = <-done
	if err == nil {
		t.Fatal("the start succeeded with no database")
	}
	for _, want := range []string{hang.Addr().String(), "did not answer within 4s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("start error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Count(err.Error(), "deadline exceeded") > 1 {
		t.Errorf("start error %q", err)
	}
}
