package coalesce

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// Every caller gets a read that started after it arrived: here, one that
// sees the write it made just before calling.
func TestReadIsNeverOlderThanTheCall(t *testing.T) {
	var writes, reads atomic.Int64
	var g Group[string, int64]
	read := func(context.Context) (int64, error) {
		reads.Add(1)
		v := writes.Load()
		time.Sleep(500 * time.Microsecond)
		return v, nil
	}
	var wg sync.WaitGroup
	const callers, rounds = 32, 20
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				mine := writes.Add(1)
				got, err := g.Do(context.Background(), "k", read)
				if err != nil || got < mine {
					t.Errorf("read %d after write %d (err %v)", got, mine, err)
					return
				}
			}
		}()
	}
	testwait.Returns(t, wg.Wait)
	if n := reads.Load(); n >= callers*rounds {
		t.Errorf("%d calls made %d reads: nothing shared", callers*rounds, n)
	}
	if n := g.Len(); n != 0 {
		t.Errorf("%d keys kept after every caller left", n)
	}
}

// Callers of different keys never share a read: each key's answer is its
// own.
func TestKeysAreApart(t *testing.T) {
	var g Group[int, int]
	release := make(chan struct{})
	var wg sync.WaitGroup
	for k := range 8 {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := g.Do(context.Background(), k, func(context.Context) (int, error) {
					<-release
					return k * 10, nil
				})
				if err != nil || got != k*10 {
					t.Errorf("key %d answered %d, %v", k, got, err)
				}
			}()
		}
	}
	for g.Len() < 8 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	testwait.Returns(t, wg.Wait)
	if n := g.Len(); n != 0 {
		t.Errorf("%d keys kept after every caller left", n)
	}
}

// A waiting caller whose context ends leaves with its cause; a leader's
// cancellation does not fail the read it runs for the others, and the
// read keeps the leader's deadline.
func TestCancellation(t *testing.T) {
	var g Group[struct{}, int]
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	read := func(ctx context.Context) (int, error) {
		started <- struct{}{}
		select {
		case <-release:
			return 7, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	leader := make(chan error, 1)
	go func() { _, err := g.Do(leaderCtx, struct{}{}, read); leader <- err }()
	testwait.Recv(t, started)

	why := errors.New("client left")
	waitCtx, cancelWait := context.WithCancelCause(context.Background())
	waiter := make(chan error, 1)
	go func() { _, err := g.Do(waitCtx, struct{}{}, read); waiter <- err }()
	cancelWait(why)
	if err := testwait.Recv(t, waiter); !errors.Is(err, why) {
		t.Fatalf("cancelled waiter: %v, want its cause", err)
	}

	cancelLeader()
	close(release)
	if err := testwait.Recv(t, leader); err != nil {
		t.Fatalf("leader's read failed with its own cancellation: %v", err)
	}
	if v, err := g.Do(context.Background(), struct{}{}, read); err != nil || v != 7 {
		t.Fatalf("next read: %d, %v", v, err)
	}

	// A shared read ends at the group's Timeout, not at the deadline of
	// the caller that runs it.
	g.Timeout = 30 * time.Millisecond
	dctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	start := time.Now()
	_, err := g.Do(dctx, struct{}{}, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Fatalf("read past the group's timeout: %v", err)
	}
}

// The caller that runs a batch's read is often the one that waited the
// longest: the read takes neither its deadline nor its cancellation, only
// the group's Timeout, so a short deadline cannot fail callers with time
// to spare.
func TestReadTakesNotTheRunnersDeadline(t *testing.T) {
	g := Group[string, int]{Timeout: 10 * time.Second}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	rctx, rcancel := g.readContext(short)
	defer rcancel()
	cancel()
	if rctx.Err() != nil {
		t.Fatal("the read ended with its runner's context")
	}
	if dl, ok := rctx.Deadline(); !ok || time.Until(dl) < 9*time.Second {
		t.Fatalf("read deadline %v, want the group's 10 s", time.Until(dl))
	}
}

// A read's error reaches every caller that shared it.
func TestErrorShared(t *testing.T) {
	var g Group[string, int]
	boom := errors.New("boom")
	hold := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), "k", func(context.Context) (int, error) { <-hold; return 0, nil })
		first <- err
	}()
	for g.Len() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	var reads atomic.Int32
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := g.Do(context.Background(), "k", func(context.Context) (int, error) {
				reads.Add(1)
				return 0, boom
			})
			if !errors.Is(err, boom) {
				t.Errorf("got %v, want the shared read's error", err)
			}
		}()
	}
	for {
		g.mu.Lock()
		waiting := g.keys["k"].callers
		g.mu.Unlock()
		if waiting == 6 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	testwait.Returns(t, wg.Wait)
	if err := testwait.Recv(t, first); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("5 waiting callers made %d reads, want 1", n)
	}
}

// A read that panics ends its batch: the runner gets the panic, the
// callers that shared it ErrReadPanicked, and the key's next read runs.
func TestPanickingReadEndsItsBatch(t *testing.T) {
	var g Group[string, int]
	hold := make(chan struct{})
	first := make(chan any, 1)
	go func() {
		defer func() { first <- recover() }()
		_, _ = g.Do(context.Background(), "k", func(context.Context) (int, error) { <-hold; return 1, nil })
	}()
	for g.Len() == 0 {
		time.Sleep(time.Millisecond)
	}
	type outcome struct {
		panicked any
		err      error
	}
	out := make(chan outcome, 2)
	boom := func(context.Context) (int, error) { panic("boom") }
	for range 2 {
		go func() {
			var o outcome
			defer func() { o.panicked = recover(); out <- o }()
			_, o.err = g.Do(context.Background(), "k", boom)
		}()
	}
	for {
		g.mu.Lock()
		n := g.keys["k"].callers
		g.mu.Unlock()
		if n == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	testwait.Recv(t, first)
	// One of the two ran the read and got its panic; the other shared it.
	panics, shared := 0, 0
	for range 2 {
		select {
		case o := <-out:
			switch {
			case o.panicked != nil:
				panics++
			case errors.Is(o.err, ErrReadPanicked):
				shared++
			default:
				t.Fatalf("caller: %v", o.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a batch whose read panicked never ended")
		}
	}
	if panics != 1 || shared != 1 {
		t.Fatalf("%d panics, %d shared errors", panics, shared)
	}
	if v, err := g.Do(context.Background(), "k", func(context.Context) (int, error) { return 7, nil }); err != nil || v != 7 {
		t.Fatalf("next read: %d, %v", v, err)
	}
}

// goCall is one call of Go, seen from its caller: the answer, and how many
// times it came.
type goCall struct {
	val     int64
	err     error
	at      time.Time // when the first answer came
	answers atomic.Int32
	done    chan struct{}
}

func callGo(g *Group[string, int64], ctx context.Context, key string, read func(context.Context) (int64, error)) *goCall {
	c := &goCall{done: make(chan struct{})}
	g.Go(ctx, key, time.Time{}, nil, read, c.answer)
	return c
}

// answer is the done function of a caller of Go: it counts every answer
// and keeps the first.
func (c *goCall) answer(v int64, err error) {
	if c.answers.Add(1) == 1 {
		c.val, c.err, c.at = v, err, time.Now()
		close(c.done)
	}
}

func (c *goCall) wait(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a caller of Go was never answered")
	}
}

// Go answers every caller exactly once with a read that started after it
// called, shares reads, and keeps no key once all are answered; callers
// of Do and Go on one key share the same batches.
func TestGoAnswersOnceWithAFreshRead(t *testing.T) {
	var writes, reads atomic.Int64
	var g Group[string, int64]
	read := func(context.Context) (int64, error) {
		reads.Add(1)
		v := writes.Load()
		time.Sleep(300 * time.Microsecond)
		return v, nil
	}
	const callers, rounds = 32, 20
	var wg sync.WaitGroup
	var calls sync.Map
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				mine := writes.Add(1)
				if i%4 == 0 {
					// A caller of Do among those of Go.
					if got, err := g.Do(context.Background(), "k", read); err != nil || got < mine {
						t.Errorf("Do read %d after write %d (err %v)", got, mine, err)
					}
					continue
				}
				c := callGo(&g, context.Background(), "k", read)
				calls.Store(c, mine)
				select { // not c.wait: its t.Fatal belongs to the test's goroutine
				case <-c.done:
				case <-time.After(10 * time.Second):
					t.Error("a caller of Go was never answered")
					return
				}
				if c.err != nil || c.val < mine {
					t.Errorf("Go read %d after write %d (err %v)", c.val, mine, c.err)
				}
			}
		}()
	}
	testwait.Returns(t, wg.Wait)
	time.Sleep(20 * time.Millisecond) // a second answer, if any, would come now
	calls.Range(func(k, _ any) bool {
		if n := k.(*goCall).answers.Load(); n != 1 {
			t.Errorf("a caller of Go answered %d times", n)
		}
		return true
	})
	if n := reads.Load(); n >= callers*rounds {
		t.Errorf("%d calls made %d reads: nothing shared", callers*rounds, n)
	}
	waitKeys(t, &g, 0)
}

// The read for the callers of Go who arrived while one was in flight
// starts before that one's callers are answered: here the first batch's
// answer waits for the second read to begin.
func TestNextReadStartsBeforeAnswers(t *testing.T) {
	var g Group[string, int64]
	release := make(chan struct{})
	secondStarted := make(chan struct{})
	var reads atomic.Int32
	read := func(context.Context) (int64, error) {
		n := reads.Add(1)
		if n == 1 {
			<-release
		} else {
			close(secondStarted)
		}
		return int64(n), nil
	}
	first := make(chan error, 1)
	g.Go(context.Background(), "k", time.Time{}, nil, read, func(v int64, err error) {
		select {
		case <-secondStarted:
			first <- err
		case <-time.After(10 * time.Second):
			first <- errors.New("the next read did not start while the first batch was being answered")
		}
	})
	for reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	second := callGo(&g, context.Background(), "k", read)
	close(release)
	if err := testwait.Recv(t, first); err != nil {
		t.Fatal(err)
	}
	second.wait(t)
	if second.err != nil || second.val != 2 {
		t.Fatalf("second caller got %d, %v; want the second read", second.val, second.err)
	}
	testwait.Returns(t, g.Wait)
	waitKeys(t, &g, 0)
}

func waitKeys(t *testing.T, g *Group[string, int64], want int) {
	t.Helper()
	for i := 0; g.Len() != want; i++ {
		if i > 1000 {
			t.Fatalf("%d keys kept, want %d", g.Len(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// A caller of Go whose context ends is answered at once with its cause,
// and only then; the read goes on for the others, and a batch waiting
// behind it still runs for its callers of Go, who have no goroutine to
// run it.
func TestGoContextEnds(t *testing.T) {
	var g Group[string, int64]
	release := make(chan struct{})
	read, _ := heldRead(release, 5)
	why := errors.New("client left")
	ctx, cancel := context.WithCancelCause(context.Background())
	inFlight := callGo(&g, ctx, "k", read)               // starts the first read
	other := callGo(&g, context.Background(), "k", read) // waits for the next one
	late := callGo(&g, ctx, "k", read)
	cancel(why)
	inFlight.wait(t)
	late.wait(t)
	if !errors.Is(inFlight.err, why) || !errors.Is(late.err, why) {
		t.Fatalf("cancelled callers: %v, %v; want the cause", inFlight.err, late.err)
	}
	close(release)
	other.wait(t)
	if other.err != nil || other.val != 5 {
		t.Fatalf("the caller waiting for the next read: %d, %v", other.val, other.err)
	}
	time.Sleep(20 * time.Millisecond)
	if inFlight.answers.Load() != 1 || late.answers.Load() != 1 || other.answers.Load() != 1 {
		t.Fatalf("answers: %d, %d, %d; want one each", inFlight.answers.Load(), late.answers.Load(), other.answers.Load())
	}
	waitKeys(t, &g, 0)
}

// A read run for callers of Go that panics answers them ErrReadPanicked,
// and the key's next read runs; the panic does not take the process down.
func TestGoPanickingRead(t *testing.T) {
	var g Group[string, int64]
	hold := make(chan struct{})
	first := callGo(&g, context.Background(), "k", func(context.Context) (int64, error) { <-hold; panic("boom") })
	second := callGo(&g, context.Background(), "k", func(context.Context) (int64, error) { panic("boom") })
	close(hold)
	first.wait(t)
	second.wait(t)
	if !errors.Is(first.err, ErrReadPanicked) || !errors.Is(second.err, ErrReadPanicked) {
		t.Fatalf("got %v and %v, want ErrReadPanicked", first.err, second.err)
	}
	next := callGo(&g, context.Background(), "k", func(context.Context) (int64, error) { return 7, nil })
	next.wait(t)
	if next.err != nil || next.val != 7 {
		t.Fatalf("next read: %d, %v", next.val, next.err)
	}
	waitKeys(t, &g, 0)
}

// When a caller of Do runs a read, the callers of Go waiting behind it
// get the next read started for them as it ends.
func TestGoWaitingBehindDo(t *testing.T) {
	var g Group[string, int64]
	hold := make(chan struct{})
	ran := make(chan int64, 1)
	go func() {
		v, _ := g.Do(context.Background(), "k", func(context.Context) (int64, error) { <-hold; return 1, nil })
		ran <- v
	}()
	waitKeys(t, &g, 1)
	c := callGo(&g, context.Background(), "k", func(context.Context) (int64, error) { return 2, nil })
	close(hold)
	if v := testwait.Recv(t, ran); v != 1 {
		t.Fatalf("Do: %d", v)
	}
	c.wait(t)
	if c.err != nil || c.val != 2 {
		t.Fatalf("Go behind Do: %d, %v; want the next read's 2", c.val, c.err)
	}
	waitKeys(t, &g, 0)
}

// A read run for callers of Go holds its key while it runs, even after
// every caller left: a caller arriving then waits for it to end rather
// than starting a second read of the key beside it. A batch whose callers
// all left before it started is not run at all.
func TestGoReadHoldsItsKey(t *testing.T) {
	var g Group[string, int64]
	release := make(chan struct{})
	var reads, running, most atomic.Int32
	read := func(context.Context) (int64, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if reads.Add(1) == 1 {
			<-release
		}
		return 1, nil
	}
	left, leave := context.WithCancel(context.Background())
	first := callGo(&g, left, "k", read)
	waitReads := func(n int32) {
		for i := 0; reads.Load() != n; i++ {
			if i > 1000 {
				t.Fatalf("%d reads, want %d", reads.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitReads(1)
	gone, goAway := context.WithCancel(context.Background())
	behind := callGo(&g, gone, "k", read) // waits for the next read, then leaves
	leave()
	goAway()
	first.wait(t)
	behind.wait(t)
	if n := g.Len(); n != 1 {
		t.Fatalf("%d keys while the read runs with its callers gone, want 1", n)
	}
	late := callGo(&g, context.Background(), "k", read)
	close(release)
	late.wait(t)
	if late.err != nil {
		t.Fatal(late.err)
	}
	if m := most.Load(); m != 1 {
		t.Fatalf("%d reads of one key at once", m)
	}
	// The first read, then late's; none for the batch whose caller left.
	if n := reads.Load(); n != 2 {
		t.Fatalf("%d reads, want 2", n)
	}
	waitKeys(t, &g, 0)
}

// Panics with no caller's stack to carry them (a read run for callers of
// Go, a caller's done) are told to OnPanic; the other callers are answered.
func TestGoPanicsTold(t *testing.T) {
	var told atomic.Int32
	g := Group[string, int64]{OnPanic: func(any) { told.Add(1) }}
	c := callGo(&g, context.Background(), "k", func(context.Context) (int64, error) { panic("read bug") })
	c.wait(t)
	if !errors.Is(c.err, ErrReadPanicked) || told.Load() != 1 {
		t.Fatalf("err %v, told %d; want ErrReadPanicked, told once", c.err, told.Load())
	}
	// Three callers of one batch (queued behind a held read), the first
	// of them with a done that panics.
	hold := make(chan struct{})
	var answered atomic.Int32
	first := callGo(&g, context.Background(), "j", func(context.Context) (int64, error) { <-hold; return 1, nil })
	g.Go(context.Background(), "j", time.Time{}, nil, func(context.Context) (int64, error) { return 2, nil },
		func(int64, error) { panic("done bug") })
	ok := callGo(&g, context.Background(), "j", func(context.Context) (int64, error) { return 2, nil })
	g.Go(context.Background(), "j", time.Time{}, nil, func(context.Context) (int64, error) { return 2, nil },
		func(int64, error) { answered.Add(1) })
	close(hold)
	first.wait(t)
	ok.wait(t)
	if ok.val != 2 {
		t.Fatalf("the batch behind answered %d, want 2", ok.val)
	}
	for i := 0; answered.Load() != 1; i++ {
		if i > 1000 {
			t.Fatal("a caller sharing a batch with a panicking done was not answered")
		}
		time.Sleep(time.Millisecond)
	}
	if told.Load() != 2 {
		t.Fatalf("told %d panics, want 2", told.Load())
	}
	waitKeys(t, &g, 0)
}

// Wait returns once the reads Go started have ended, the batch started
// behind a read included.
func TestWaitForReads(t *testing.T) {
	var g Group[string, int64]
	release := make(chan struct{})
	var ended atomic.Int32
	read := func(context.Context) (int64, error) {
		<-release
		ended.Add(1)
		return 1, nil
	}
	first := callGo(&g, context.Background(), "k", read)
	second := callGo(&g, context.Background(), "k", read) // the next batch
	waited := make(chan struct{})
	go func() { g.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned with a read running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the reads ended")
	}
	if n := ended.Load(); n != 2 {
		t.Fatalf("Wait returned after %d reads, want both", n)
	}
	first.wait(t)
	second.wait(t)
}

// heldRead returns a read of v whose first call waits for release, and
// the count of its calls.
func heldRead(release <-chan struct{}, v int64) (func(context.Context) (int64, error), *atomic.Int32) {
	reads := new(atomic.Int32)
	return func(context.Context) (int64, error) {
		if reads.Add(1) == 1 {
			<-release
		}
		return v, nil
	}, reads
}

// fakeClock is a Group.Clock the test moves, and a read's value is the
// moment it read (Fresh compares the two).
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) withFresh(g *Group[string, int64]) *fakeClock {
	g.Clock = c.now.Load
	g.Fresh = func(readAt, arrived int64) bool { return arrived <= readAt }
	return c
}

// With Fresh, a read answers the callers of Go that arrived while it was
// in flight but before it read; those that arrived after wait for the
// next read, which runs only if one of them is left.
func TestFreshReadAnswersWhoCameBeforeIt(t *testing.T) {
	for _, late := range []bool{false, true} {
		var g Group[string, int64]
		clock := new(fakeClock).withFresh(&g)
		release := make(chan int64)
		var reads atomic.Int32
		read := func(context.Context) (int64, error) {
			if reads.Add(1) == 1 {
				return <-release, nil
			}
			return 1000, nil
		}
		clock.now.Store(10)
		first := callGo(&g, context.Background(), "k", read)
		for reads.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		clock.now.Store(15)
		early := callGo(&g, context.Background(), "k", read)
		var after *goCall
		if late {
			clock.now.Store(25)
			after = callGo(&g, context.Background(), "k", read)
		}
		release <- 20 // the first read read at 20
		first.wait(t)
		early.wait(t)
		if first.val != 20 || early.val != 20 {
			t.Fatalf("first and early callers got %d and %d; want the first read's 20 for both", first.val, early.val)
		}
		want := int32(1)
		if late {
			after.wait(t)
			if after.val != 1000 {
				t.Fatalf("the caller that came after the first read read got %d; want the next read's", after.val)
			}
			want = 2
		}
		testwait.Returns(t, g.Wait)
		time.Sleep(20 * time.Millisecond) // a read for nobody would start now
		if n := reads.Load(); n != want {
			t.Fatalf("late=%v: %d reads, want %d", late, n, want)
		}
		for _, c := range []*goCall{first, early, after} {
			if c != nil && c.answers.Load() != 1 {
				t.Fatalf("a caller answered %d times", c.answers.Load())
			}
		}
		waitKeys(t, &g, 0)
	}
}

// A failed read answers only its own batch: the callers that came while
// it was in flight get a read of their own.
func TestFreshReadFailedSharesNothingMore(t *testing.T) {
	var g Group[string, int64]
	clock := new(fakeClock).withFresh(&g)
	release := make(chan struct{})
	var reads atomic.Int32
	read := func(context.Context) (int64, error) {
		if reads.Add(1) == 1 {
			<-release
			return 100, errors.New("down")
		}
		return 200, nil
	}
	first := callGo(&g, context.Background(), "k", read)
	for reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	clock.now.Store(1)
	early := callGo(&g, context.Background(), "k", read)
	close(release)
	first.wait(t)
	early.wait(t)
	if first.err == nil || early.err != nil || early.val != 200 {
		t.Fatalf("first: %d, %v; early: %d, %v; want the error, then the second read", first.val, first.err, early.val, early.err)
	}
	testwait.Returns(t, g.Wait)
	waitKeys(t, &g, 0)
}

// A caller whose context ends as the read it may join ends is answered
// once, by one or the other, and leaves no key behind.
func TestFreshJoinRacesTheCallersEnd(t *testing.T) {
	for range 200 {
		var g Group[string, int64]
		new(fakeClock).withFresh(&g)
		release := make(chan struct{})
		read, reads := heldRead(release, 0)
		first := callGo(&g, context.Background(), "k", read)
		for reads.Load() == 0 {
			runtime.Gosched()
		}
		ctx, cancel := context.WithCancel(context.Background())
		early := callGo(&g, ctx, "k", read)
		go cancel()
		close(release)
		first.wait(t)
		early.wait(t)
		testwait.Returns(t, g.Wait)
		time.Sleep(time.Millisecond)
		if n := early.answers.Load(); n != 1 {
			t.Fatalf("the caller was answered %d times", n)
		}
		if early.err != nil && !errors.Is(early.err, context.Canceled) {
			t.Fatalf("early: %v", early.err)
		}
		waitKeys(t, &g, 0)
	}
}

// Under callers of Go that each write and then read, with Fresh judging
// by a clock every read and arrival ticks, every caller still sees its
// own write, shared reads or not.
func TestFreshReadsNeverOlderThanTheCall(t *testing.T) {
	var tick, writes, reads atomic.Int64
	var g Group[string, [2]int64] // a read's value: when it read, what it saw
	g.Clock = func() int64 { return tick.Add(1) }
	g.Fresh = func(v [2]int64, arrived int64) bool { return arrived <= v[0] }
	read := func(context.Context) ([2]int64, error) {
		reads.Add(1)
		at := tick.Add(1)
		v := writes.Load()
		time.Sleep(200 * time.Microsecond)
		return [2]int64{at, v}, nil
	}
	const callers, rounds = 32, 20
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				mine := writes.Add(1)
				got := make(chan [2]int64, 1)
				g.Go(context.Background(), "k", time.Time{}, nil, read, func(v [2]int64, err error) {
					if err != nil {
						t.Error(err)
					}
					got <- v
				})
				select {
				case v := <-got:
					if v[1] < mine {
						t.Errorf("read %d after write %d", v[1], mine)
					}
				case <-time.After(10 * time.Second):
					t.Error("a caller was never answered")
					return
				}
			}
		}()
	}
	testwait.Returns(t, wg.Wait)
	testwait.Returns(t, g.Wait)
	if n := reads.Load(); n >= callers*rounds {
		t.Errorf("%d calls made %d reads: nothing shared", callers*rounds, n)
	}
}
