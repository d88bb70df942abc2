package pg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The gate keeps an acquisition's context (inFlight, inflight.go) for the
// next acquisition once the acquisition ended and the context was not
// done. That is sound only while pgx's pool (pgx 5.13 over puddle v2)
// touches an acquisition's context after Acquire returned only when that
// context was done: the constructor goroutine of a connection its caller
// gave up on, an abandoned ping. Were an upgrade to keep an undone one
// (a goroutine reading its values, a watch on its Done), a kept context
// handed to the next caller would give that goroutine another call's
// values, and the next caller's cancellation would reach it. These tests
// pin the behaviour on the real PostgreSQL: an acquisition whose context
// stays undone, by every path Acquire takes (a new connection, an idle
// one pinged, a connection that could not be made), leaves nothing
// holding its context: no method of it is called after Acquire returned,
// and making it done afterwards changes nothing for the pool.

// probeKey marks, by its value, the acquisitions the tracer probes.
type probeKey struct{}

// probe is an acquisition's context that counts what is asked of it once
// its acquisition ended.
type probe struct {
	parent context.Context
	done   chan struct{}
	ended  atomic.Bool
	mu     sync.Mutex
	after  []string // the methods called after the end
}

func (p *probe) use(method string) {
	if p.ended.Load() {
		p.mu.Lock()
		p.after = append(p.after, method)
		p.mu.Unlock()
	}
}

func (p *probe) Deadline() (time.Time, bool) { p.use("Deadline"); return p.parent.Deadline() }
func (p *probe) Done() <-chan struct{}       { p.use("Done"); return p.done }
func (p *probe) Value(key any) any           { p.use("Value"); return p.parent.Value(key) }
func (p *probe) Err() error {
	p.use("Err")
	select {
	case <-p.done:
		return context.Canceled
	default:
		return nil
	}
}

// touched is what was asked of p after its acquisition ended.
func (p *probe) touched() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.after...)
}

// probeTracer hands the acquisitions marked with probeKey a probe of
// their own, and ends it as the acquisition ends, as the gate's tracer
// does with an inFlight.
type probeTracer struct{}

func (probeTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if p, ok := ctx.Value(probeKey{}).(*probe); ok {
		p.parent = ctx
		return p
	}
	return ctx
}

func (probeTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if p, ok := ctx.(*probe); ok {
		p.ended.Store(true)
	}
}

func (probeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (probeTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// probedPool is a pool of at most one connection on the test database
// that pings every connection it hands out (the idle path's ping), with
// hook, when not nil, as its BeforeConnect.
func probedPool(t *testing.T, ctx context.Context, hook func(context.Context, *pgx.ConnConfig) error) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = probeTracer{}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	cfg.BeforeConnect = hook
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// acquireProbed acquires with a probe that stays undone, releases the
// connection, and returns the probe and what Acquire returned.
func acquireProbed(ctx context.Context, pool *pgxpool.Pool) (*probe, error) {
	p := &probe{done: make(chan struct{})}
	conn, err := pool.Acquire(context.WithValue(ctx, probeKey{}, p))
	if !p.ended.Load() {
		return p, fmt.Errorf("the tracer's end did not run (%v)", err)
	}
	if err != nil {
		return p, err
	}
	conn.Release()
	return p, nil
}

// use runs statements on pool after a probe's acquisition, closes the
// probe (as a later caller of the kept context would when it gives up)
// and runs more, then closes the pool: anything holding the probe would
// ask it something, or end a connection on its Done.
func use(t *testing.T, ctx context.Context, pool *pgxpool.Pool, p *probe) {
	t.Helper()
	for range 3 {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("a call after the probed acquisition: %v", err)
		}
	}
	made := pool.Stat().NewConnsCount()
	close(p.done)
	for range 3 {
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("a call once the probed acquisition's context is done: %v", err)
		}
	}
	if n := pool.Stat().NewConnsCount(); n != made {
		t.Errorf("the probed acquisition's context, done after the acquisition, ended a connection: %d made, %d before", n, made)
	}
	pool.Close()
	if got := p.touched(); len(got) > 0 {
		t.Errorf("the pool asked %s of an acquisition's context after the acquisition had ended, the context undone: "+
			"the gate may no longer keep such contexts (inflight.go)", strings.Join(got, ", "))
	}
}

func TestPoolHoldsNoUndoneAcquisitionContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("a new connection", func(t *testing.T) {
		pool := probedPool(t, ctx, nil)
		defer pool.Close()
		p, err := acquireProbed(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if n := pool.Stat().NewConnsCount(); n != 1 {
			t.Fatalf("%d connections made, want the probed acquisition's one", n)
		}
		use(t, ctx, pool, p)
	})

	t.Run("an idle connection, pinged", func(t *testing.T) {
		pool := probedPool(t, ctx, nil)
		defer pool.Close()
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		p, err := acquireProbed(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if n := pool.Stat().NewConnsCount(); n != 1 {
			t.Fatalf("%d connections made, want the idle one taken", n)
		}
		use(t, ctx, pool, p)
	})

	t.Run("a connection that could not be made", func(t *testing.T) {
		refuse := errors.New("refused by the test")
		var refused atomic.Bool
		pool := probedPool(t, ctx, func(ctx context.Context, _ *pgx.ConnConfig) error {
			if _, ok := ctx.Value(probeKey{}).(*probe); ok {
				refused.Store(true)
				return refuse
			}
			return nil
		})
		defer pool.Close()
		p, err := acquireProbed(ctx, pool)
		if !errors.Is(err, refuse) || !refused.Load() {
			t.Fatalf("the probed acquisition: %v, want the connection refused", err)
		}
		use(t, ctx, pool, p)
	})
}

// The probe sees a context held past its acquisition: without this, the
// test above would pass on a probe that saw nothing.
func TestProbeSeesAHeldAcquisitionContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	release := make(chan struct{})
	var held sync.WaitGroup
	pool := probedPool(t, ctx, func(ctx context.Context, _ *pgx.ConnConfig) error {
		// What an upgrade keeping the context would do: read it after
		// the acquisition returned.
		held.Go(func() {
			<-release
			_ = ctx.Value(probeKey{})
		})
		return nil
	})
	defer pool.Close()
	p, err := acquireProbed(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	held.Wait()
	if got := p.touched(); len(got) == 0 {
		t.Fatal("the probe saw nothing of a context held past its acquisition")
	}
}
