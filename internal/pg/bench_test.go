package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// BenchmarkExec measures one pool.Exec (an acquisition and a statement)
// on a pool made by Open against a real PostgreSQL, watched (every
// acquisition and statement cancellable by Watch's failed ping, see
// gate.enter) and not: the difference is what that guarantee costs a
// call. The caller's context is either Background or one with a
// deadline, as a service's request has (pgx watches any context that can
// be done, whoever made it).
func BenchmarkExec(b *testing.B) {
	url := testenv.Postgres(b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pg.Open(ctx, url, "bench", nil, testenv.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for _, watched := range []bool{false, true} {
		name := "unwatched"
		if watched {
			name = "watched"
		}
		b.Run(name, func(b *testing.B) {
			if watched {
				wctx, stopWatch := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() {
					defer close(done)
					pg.Watch(wctx, pool, func(error) {})
				}()
				defer func() { stopWatch(); <-done }()
			}
			for _, callCtx := range []struct {
				name string
				ctx  context.Context
			}{{"ctx=background", context.Background()}, {"ctx=deadline", ctx}} {
				b.Run(callCtx.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						if _, err := pool.Exec(callCtx.ctx, "SELECT 1"); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// A statement on a watched pool costs no allocation more than on an
// unwatched one: Watch ends it by its connection (gate.strike), not by a
// context of its own. Each had a cancel context, its map entry and pgx's
// context watch registered anew on it: 6 allocations (12 against 6 for
// a statement made with a deadline). Nor does a pool.Exec made without a
// deadline, whose acquisition's context is one kept from an earlier
// acquisition (16 against 2 before). Counted, not timed.
func TestWatchingAllocatesNothingMore(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pg.Open(ctx, url, "allocs", nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	calls := []struct {
		name string
		f    func()
	}{
		{"a statement made with a deadline", func() {
			if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
		}},
		{"a pool.Exec made without", func() {
			if _, err := pool.Exec(context.Background(), "SELECT 1"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	unwatched := make([]float64, len(calls))
	for i, c := range calls {
		c.f()
		unwatched[i] = fewestAllocs(c.f)
	}

	wctx, stopWatch := context.WithCancel(ctx)
	done := make(chan struct{})
	defer func() { stopWatch(); <-done }()
	go func() {
		defer close(done)
		pg.Watch(wctx, pool, func(error) {})
	}()
	for i, c := range calls {
		c.f()
		watched := fewestAllocs(c.f)
		if watched > unwatched[i] {
			t.Errorf("%s on a watched pool: %v allocations, %v unwatched", c.name, watched, unwatched[i])
			continue
		}
		t.Logf("%s: %v allocations, watched or not", c.name, watched)
	}
}

// fewestAllocs is the fewest allocations f made a run over three counts
// of 200 runs. A count takes in whatever the process allocated
// meanwhile, the watch's own rounds among them: once, at load, one of
// them fell into a count and made 2 allocations a run read 3. Another
// goroutine's allocations only add, so the fewest is f's own.
func fewestAllocs(f func()) float64 {
	n := testing.AllocsPerRun(200, f)
	for range 2 {
		n = min(n, testing.AllocsPerRun(200, f))
	}
	return n
}
