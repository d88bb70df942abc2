package pg_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// openPool opens a pool of schema on url, of maxConns connections at
// most when not 0; it closes at the test's end.
func openPool(t *testing.T, ctx context.Context, url, schema string, maxConns int) *pgxpool.Pool {
	t.Helper()
	if maxConns != 0 {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + "pool_max_conns=" + strconv.Itoa(maxConns)
	}
	pool, err := pg.Open(ctx, url, schema, nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// watch runs Watch on pool, with report, until the test's end, and
// waits for it to return then, before the pool closes.
func watch(t *testing.T, ctx context.Context, pool *pgxpool.Pool, report func(error)) {
	wctx, stop := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		pg.Watch(wctx, pool, report)
	}()
	t.Cleanup(func() { stop(); <-watched })
}

// A database that stops answering: once Watch has seen it gone, a call
// fails at once as unavailable instead of waiting its whole deadline on
// a connection nobody answers (each call took its 10 s, health already
// saying the database was gone), and calls work again as soon as the
// database answers, with no failure kept.
func TestCallsFailAtOnceWhileTheDatabaseIsSeenGone(t *testing.T) {
	r, stalled := stallingRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := openPool(t, ctx, r.URL, "stall", 0)
	var down atomic.Bool
	watch(t, ctx, pool, func(err error) { down.Store(err != nil) })

	stalled.Store(true)
	stalledAt := time.Now()
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !down.Load() {
			return errors.New("Watch has not seen the database gone")
		}
		return nil
	})
	seen := time.Now()
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := pool.Exec(callCtx, "SELECT 1")
	callCancel()
	if !errors.Is(err, pg.ErrUnavailable) || !pg.IsUnavailable(err) {
		t.Fatalf("a call once the database was seen gone: %v, want %v", err, pg.ErrUnavailable)
	}
	t.Logf("seen gone %v after the stall; the call failed %v after that", seen.Sub(stalledAt).Round(time.Millisecond), time.Since(seen).Round(time.Millisecond))

	stalled.Store(false)
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		_, err := pool.Exec(ctx, "SELECT 1")
		return err
	})
	if down.Load() {
		t.Error("a call worked again while health still said the database was gone")
	}

	// A call that finds the database gone says so before Watch does
	// (MarkUnavailable, as the service frame does for such a call):
	// Watch asks at once, and a database that answers is not kept for
	// gone until the next tick.
	pg.MarkUnavailable(pool)
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		_, err := pool.Exec(ctx, "SELECT 1")
		return err
	})
}

// A pool whose every connection is busy on a long statement is not a
// database gone: Watch's ping waited for a connection of the pool, timed
// out after WatchInterval and closed the pool to new work, so a call
// made while the statement ran failed "database unavailable" at once on
// a database that answered all along (health had said NOT_SERVING
// before the gate; with it the busy pool refused work). Watch pings on
// a connection of its own.
func TestBusyPoolIsNotADatabaseGone(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := openPool(t, ctx, url, "busypool", 1)
	var reports, downs atomic.Int32
	watch(t, ctx, pool, func(err error) {
		reports.Add(1)
		if err != nil {
			downs.Add(1)
		}
	})

	long := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, "SELECT pg_sleep(3.5)")
		long <- err
	}()
	// Past Watch's first two pings, each of which waited its whole
	// interval for the one connection before.
	time.Sleep(2600 * time.Millisecond)
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := pool.Exec(callCtx, "SELECT 1")
	callCancel()
	if err != nil {
		t.Fatalf("a call while the pool's one connection was busy: %v, want it served once the connection was free", err)
	}
	if err := <-long; err != nil {
		t.Fatal(err)
	}
	if reports.Load() == 0 {
		t.Fatal("Watch reported nothing")
	}
	if n := downs.Load(); n != 0 {
		t.Fatalf("Watch reported the database gone %d times while it answered a long statement", n)
	}
}

// Calls already waiting on the database when it stops answering end
// once Watch sees it gone, as unavailable, before their own deadline: a
// transaction's statement on a server that does not answer, and an
// acquisition waiting for the connection that statement holds. Before,
// the gate refused only the calls made after; these waited their whole
// deadline (10 s a call) while health said the database was gone. The
// transaction is rolled back: nothing of it is stored once the server
// answers again.
func TestCallsInFlightEndWhenTheDatabaseIsSeenGone(t *testing.T) {
	r, stalled := stallingRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One connection: the acquisition below waits for the one the
	// transaction holds.
	pool := openPool(t, ctx, r.URL, "inflight", 1)
	if _, err := pool.Exec(ctx, "CREATE TABLE items (id int)"); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	watch(t, ctx, pool, func(err error) { down.Store(err != nil) })

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO items VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	stalled.Store(true)
	type outcome struct {
		what        string
		err         error
		deadlineHit error // the call's own context when it returned
	}
	out := make(chan outcome, 2)
	call := func(what string, f func(context.Context) error) {
		callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
		defer callCancel()
		err := f(callCtx)
		out <- outcome{what, err, callCtx.Err()}
	}
	go call("a statement", func(ctx context.Context) error {
		_, err := tx.Exec(ctx, "INSERT INTO items VALUES (2)")
		return err
	})
	go call("an acquisition", func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "INSERT INTO items VALUES (3)")
		return err
	})
	for range 2 {
		o := <-out
		if o.deadlineHit != nil || !pg.IsUnavailable(o.err) {
			t.Errorf("%s in flight when the database stopped answering: %v (its own context: %v), want unavailable before its deadline", o.what, o.err, o.deadlineHit)
		}
		if o.what == "an acquisition" && !errors.Is(o.err, pg.ErrUnavailable) {
			t.Errorf("the acquisition failed %v, want %v", o.err, pg.ErrUnavailable)
		}
		t.Logf("%s: %v", o.what, o.err)
	}
	if !down.Load() {
		t.Error("calls were ended while health said the database answered")
	}
	rbCtx, rbCancel := context.WithTimeout(ctx, 10*time.Second)
	_ = tx.Rollback(rbCtx)
	if rbCtx.Err() != nil {
		t.Error("the rollback waited its whole deadline")
	}
	rbCancel()

	stalled.Store(false)
	// Once the transaction's backend is gone (Settled), what it did is
	// all it will ever do.
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !pg.WritesOf(pool).Settled(ctx, pool) {
			return errors.New("the cut transaction's backend is still there")
		}
		return nil
	})
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows stored by calls that failed unavailable", n)
	}
}

// stallingRelay relays to the test's PostgreSQL; while stalled is set,
// nothing crosses it either way, as with a server that stopped
// answering.
func stallingRelay(t *testing.T) (testenv.PostgresRelayed, *atomic.Bool) {
	t.Helper()
	r := testenv.RelayPostgres(t, testenv.Postgres(t))
	stalled := new(atomic.Bool)
	testenv.StartRelay(t, r.Path, r.Target, func() testenv.RelayHook {
		return func(bool, []byte) bool {
			for stalled.Load() {
				time.Sleep(5 * time.Millisecond)
			}
			return true
		}
	})
	// Runs before the relay's Close: its goroutines must not wait on.
	t.Cleanup(func() { stalled.Store(false) })
	return r, stalled
}

// An acquisition on a watched pool that its caller gives up on ends with
// the caller's own error, not as unavailable, and the contexts the gate
// keeps for the next acquisitions (inFlight) carry nothing of it: the
// calls after, with and without a deadline, are served.
func TestWatchedAcquisitionEndsWithItsCaller(t *testing.T) {
	url := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := openPool(t, ctx, url, "acquire", 1)
	watch(t, ctx, pool, func(error) {})
	for i := range 20 {
		held, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Waits for the held connection until its caller gives up: by
		// its deadline, or cancelled.
		callCtx, callCancel := context.WithTimeout(ctx, 20*time.Millisecond)
		want := context.DeadlineExceeded
		if i%2 == 1 {
			callCancel()
			want = context.Canceled
		}
		_, err = pool.Exec(callCtx, "SELECT 1")
		callCancel()
		held.Release()
		if !errors.Is(err, want) || errors.Is(err, pg.ErrUnavailable) {
			t.Fatalf("an acquisition its caller gave up on: %v, want %v", err, want)
		}
		for _, c := range []context.Context{ctx, context.Background()} {
			if _, err := pool.Exec(c, "SELECT 1"); err != nil {
				t.Fatalf("a call after one its caller gave up on: %v", err)
			}
		}
	}
}
