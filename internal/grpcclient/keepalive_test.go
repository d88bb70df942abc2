package grpcclient

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
)

// freezer relays Unix connections to a server and can stop relaying
// altogether, as a stopped (SIGSTOP) or deadlocked process would: bytes
// sit in the socket buffers, nothing answers.
type freezer struct {
	mu     sync.Mutex
	frozen chan struct{} // closed when frozen
	conns  []net.Conn
}

func (f *freezer) serve(ln net.Listener, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("unix", target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		go f.relay(c, s)
		go f.relay(s, c)
	}
}

func (f *freezer) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			return // hold everything: never write, never read again
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

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

	front := filepath.Join(dir, "front.sock")
	ln, err := net.Listen("unix", front)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f := &freezer{frozen: make(chan struct{})}
	defer f.close()
	go f.serve(ln, filepath.Join(dir, "server.sock"))

	cc, err := Dial(front)
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
	close(f.frozen)
	frozen := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := w.Recv()
		done <- err
	}()
	select {
	case err := <-done:
		took := time.Since(frozen)
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
