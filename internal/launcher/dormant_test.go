package launcher

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/listenfd"
)

func privateDir(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "dz")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The held socket wakes the bridge once, at the first connection, which
// stays in the backlog for the bridge to accept; a stale gRPC socket is
// cleared; close ends the watch, release removes the socket.
func TestDormantWakesOnFirstConnection(t *testing.T) {
	t.Setenv(durablesock.EnvSocket, "")
	dir := privateDir(t)
	stale := datadir.ServiceSocket(dir, DurableBridge, 0)
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := holdDurable(dir, zap.NewNop())
	if err != nil || d == nil {
		t.Fatalf("holdDurable: %v, %v", d, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale gRPC socket kept: %v", err)
	}
	if _, err := os.Stat(datadir.Dormant(dir, DurableBridge)); err != nil {
		t.Fatalf("not marked dormant for the gateway: %v", err)
	}
	var starts atomic.Int32
	woke := make(chan struct{}, 2)
	d.watch(func() error { starts.Add(1); woke <- struct{}{}; return nil })
	select {
	case <-woke:
		t.Fatal("woken with no client")
	case <-time.After(100 * time.Millisecond):
	}
	c, err := net.Dial("unix", filepath.Join(dir, "durable.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("a client connected and the bridge was not woken")
	}
	// The connection waits for the bridge, which gets the same socket.
	f := d.passed()
	if f == nil {
		t.Fatal("no socket to hand over")
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetDeadline(time.Now().Add(10 * time.Second))
	if conn, err := ln.Accept(); err != nil {
		t.Fatalf("the waking connection is not in the backlog: %v", err)
	} else {
		conn.Close()
	}
	ln.Close()
	d.close() // waits for the watch, which marks the directory after the start
	if n := starts.Load(); n != 1 {
		t.Fatalf("started %d times", n)
	}
	if _, err := os.Stat(datadir.DurableWoken(dir)); err != nil {
		t.Fatalf("not marked: %v", err)
	}
	if _, err := os.Stat(datadir.Dormant(dir, DurableBridge)); !os.IsNotExist(err) {
		t.Fatalf("still marked dormant once started: %v", err)
	}
	d.release()
	if _, err := os.Stat(filepath.Join(dir, "durable.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left after release: %v", err)
	}
}

// Nothing is held when the bridge has run before or its socket is put
// elsewhere; close with no watch, and release, end a dormant that never
// woke.
func TestDormantOnlyWhenNeverRun(t *testing.T) {
	dir := privateDir(t)
	t.Setenv(durablesock.EnvSocket, filepath.Join(dir, "elsewhere.sock"))
	if d, err := holdDurable(dir, zap.NewNop()); d != nil || err != nil {
		t.Fatalf("with %s set: %v, %v", durablesock.EnvSocket, d, err)
	}
	t.Setenv(durablesock.EnvSocket, "")
	d, err := holdDurable(dir, zap.NewNop())
	if err != nil || d == nil {
		t.Fatalf("fresh directory: %v, %v", d, err)
	}
	d.close()
	d.release()
	if err := os.WriteFile(datadir.DurableWoken(dir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A marker left by a launcher that died goes when nothing is held.
	if err := os.WriteFile(datadir.Dormant(dir, DurableBridge), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if d, err := holdDurable(dir, zap.NewNop()); d != nil || err != nil {
		t.Fatalf("after the bridge ran: %v, %v", d, err)
	}
	if _, err := os.Stat(datadir.Dormant(dir, DurableBridge)); !os.IsNotExist(err) {
		t.Fatalf("stale dormant marker kept: %v", err)
	}
}

// upload-staging's gRPC socket is held on every start and marked
// dormant; the first connection, a gRPC call, waits in its backlog while
// the service starts, is served by it on the socket it is handed, and
// the marker goes once the start returns. release removes the socket.
func TestDormantStagingServesTheWakingCall(t *testing.T) {
	dir := privateDir(t)
	path := datadir.ServiceSocket(dir, UploadStaging, 0)
	d, err := holdStaging(dir, zap.NewNop())
	if err != nil || d == nil {
		t.Fatalf("holdStaging: %v, %v", d, err)
	}
	if d.fdName != listenfd.GRPCSocket {
		t.Fatalf("handed as %q", d.fdName)
	}
	if _, err := os.Stat(datadir.Dormant(dir, UploadStaging)); err != nil {
		t.Fatalf("not marked dormant: %v", err)
	}
	var starts atomic.Int32
	served := make(chan *grpc.Server, 1)
	d.watch(func() error {
		starts.Add(1)
		ln, err := net.FileListener(d.passed())
		if err != nil {
			return err
		}
		srv := grpc.NewServer()
		hs := health.NewServer()
		healthpb.RegisterHealthServer(srv, hs)
		go func() { _ = srv.Serve(ln) }()
		served <- srv
		return nil
	})
	// Dialled as the gateway dials upload-staging.
	cc, err := grpcclient.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the waking call: %v, %v", resp, err)
	}
	srv := <-served
	d.close()
	srv.Stop()
	if n := starts.Load(); n != 1 {
		t.Fatalf("started %d times", n)
	}
	if _, err := os.Stat(datadir.Dormant(dir, UploadStaging)); !os.IsNotExist(err) {
		t.Fatalf("still marked dormant once started: %v", err)
	}
	if _, err := os.Stat(datadir.DurableWoken(dir)); !os.IsNotExist(err) {
		t.Fatalf("upload-staging's wake marked the bridge's: %v", err)
	}
	d.release()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket left after release: %v", err)
	}
}

// A default socket path that cannot be held (too long here) does not stop
// the stack: the bridge starts with the others and says itself what is
// wrong. A wake whose start fails closes the held socket (a waiting client
// is refused, not left hanging) and leaves the directory unmarked.
func TestDormantFailures(t *testing.T) {
	t.Setenv(durablesock.EnvSocket, "")
	long := filepath.Join(privateDir(t), strings.Repeat("x", 100))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	if d, err := holdDurable(long, zap.NewNop()); d != nil || err != nil {
		t.Fatalf("a path too long to hold: %v, %v; want the bridge started with the stack", d, err)
	}

	dir := privateDir(t)
	d, err := holdDurable(dir, zap.NewNop())
	if err != nil || d == nil {
		t.Fatalf("holdDurable: %v, %v", d, err)
	}
	d.watch(func() error { return errors.New("exec failed") })
	c, err := net.Dial("unix", filepath.Join(dir, "durable.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the waiting client was not let go: %v", err)
	}
	d.release()
	if _, err := os.Stat(datadir.DurableWoken(dir)); !os.IsNotExist(err) {
		t.Fatalf("marked although the bridge never started: %v", err)
	}
	if _, err := os.Stat(datadir.Dormant(dir, DurableBridge)); !os.IsNotExist(err) {
		t.Fatalf("marked dormant although its start failed: %v", err)
	}
	if _, err := net.Dial("unix", filepath.Join(dir, "durable.sock")); err == nil {
		t.Fatal("the socket still takes connections")
	}
}
