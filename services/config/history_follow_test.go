package config

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	"github.com/clawmesh/clawmesh/services/config/migrations"
)

// switchable is the config service as its consumers reach it: one
// address, behind which a process is replaced by another.
type switchable struct {
	configv1.ConfigServiceClient
	mu  sync.Mutex
	srv *Server
}

func (s *switchable) to(srv *Server) { s.mu.Lock(); s.srv = srv; s.mu.Unlock() }

func (s *switchable) Live(ctx context.Context, req *configv1.LiveRequest, _ ...grpc.CallOption) (*configv1.LiveResponse, error) {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	return srv.Live(ctx, req)
}

// replacement starts another config process, on a new database, that
// announces on e's bus.
func (e *env) replacement(t *testing.T) *Server {
	t.Helper()
	ctx := ctxFor(t)
	db, err := pg.Open(ctx, testenv.Postgres(t), "config", migrations.FS, e.opts.Log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	opts := e.opts
	opts.DB = db
	srv, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func followerOf(t *testing.T, e *env, target *switchable) *configclient.Client {
	t.Helper()
	ctx := ctxFor(t)
	c, err := configclient.New(ctx, target, e.nats(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func timeoutOf(c *configclient.Client) any {
	v, _ := c.Current().Value("rpc.call_timeout_ms")
	return v
}

// A config database replaced by another whose history reached the same
// revision number with other content: its consumers compared numbers
// alone and kept the old document for ever (rpc.call_timeout_ms 2500
// where the service served 3500, both at revision 1). Each history now
// has an identity on the wire; a different one is read and installed.
func TestReplacedHistoryAtTheSameRevisionIsFollowed(t *testing.T) {
	a := newEnv(t, nil)
	rev := a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	target := &switchable{srv: a.srv}
	c := followerOf(t, a, target)
	if got := timeoutOf(c); got != float64(2500) {
		t.Fatalf("follower starts with rpc.call_timeout_ms %v, want 2500", got)
	}

	b := a.replacement(t)
	target.to(b)
	resp, err := b.SetMany(ctxFor(t), &configv1.SetManyRequest{Principal: operator, Sets: entries(t, kv{"rpc.call_timeout_ms", 3500})})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRevision() != rev {
		t.Fatalf("the new history's commit is revision %d, want %d (the same number)", resp.GetRevision(), rev)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := timeoutOf(c); got != float64(3500) || c.Current().Revision != rev {
			return fmt.Errorf("follower at revision %d, rpc.call_timeout_ms %v; want %d, 3500 (the new history's)", c.Current().Revision, got, rev)
		}
		return nil
	})
}

// A config process that starts on a reset database serves a lower
// revision, and announced nothing: its consumers read it at their next
// resync, 30 s on. It now announces its revision at start.
func TestRestartOnAResetDatabaseIsFollowed(t *testing.T) {
	a := newEnv(t, nil)
	a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	a.mustSet(kv{"rpc.call_timeout_ms", 2600})
	target := &switchable{srv: a.srv}
	c := followerOf(t, a, target)

	// The process stops; its replacement starts on a reset database.
	b := a.replacement(t)
	target.to(b)
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); b.Run(runCtx) }()
	t.Cleanup(func() { stop(); testwait.Recv(t, ran) })
	started := time.Now()
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := c.Current().Revision; got != 0 || timeoutOf(c) != float64(10000) {
			return fmt.Errorf("follower at revision %d, rpc.call_timeout_ms %v; want 0 and the default 10000", got, timeoutOf(c))
		}
		return nil
	})
	t.Logf("the reset database's revision followed %v after its process started", time.Since(started).Round(time.Millisecond))
}
