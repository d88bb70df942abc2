package coalesce

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// goCallBy is callGo with a deadline and an owner.
func goCallBy(g *Group[string, int64], key string, deadline time.Time, owner *Owner, read func(context.Context) (int64, error)) *goCall {
	c := &goCall{done: make(chan struct{})}
	g.Go(context.Background(), key, deadline, owner, read, c.answer)
	return c
}

// waitingUntilRelease checks that c is not answered yet, releases the
// read it waits for and checks that c then gets the read's value want.
func (c *goCall) waitingUntilRelease(t *testing.T, who string, release chan struct{}, want int64) {
	t.Helper()
	select {
	case <-c.done:
		t.Fatalf("%s answered before its read: %d, %v", who, c.val, c.err)
	default:
	}
	close(release)
	c.wait(t)
	if c.err != nil || c.val != want {
		t.Fatalf("%s: %d, %v; want %d", who, c.val, c.err, want)
	}
}

// answeredOnce checks, a moment after the last answer expected, that no
// caller was answered twice.
func answeredOnce(t *testing.T, calls ...*goCall) {
	t.Helper()
	time.Sleep(20 * time.Millisecond)
	for _, c := range calls {
		if n := c.answers.Load(); n != 1 {
			t.Fatalf("a caller answered %d times", n)
		}
	}
}

// Callers of Go are answered context.DeadlineExceeded at their own
// deadlines, never before, in whatever order they came: one timer a batch
// is set for its earliest caller. The read goes on for the callers left.
func TestGoDeadlines(t *testing.T) {
	var g Group[string, int64]
	release := make(chan struct{})
	read, _ := heldRead(release, 5)
	start := time.Now()
	inFlight := goCallBy(&g, "k", start.Add(40*time.Millisecond), nil, read) // starts the first read
	// Waiting for the next read: the later caller has the earlier deadline.
	patient := goCallBy(&g, "k", time.Time{}, nil, read)
	far := start.Add(time.Second)
	slow := goCallBy(&g, "k", far, nil, read)
	near := start.Add(60 * time.Millisecond)
	quick := goCallBy(&g, "k", near, nil, read)

	for _, c := range []struct {
		name     string
		call     *goCall
		deadline time.Time
	}{{"in flight", inFlight, start.Add(40 * time.Millisecond)}, {"quick", quick, near}, {"slow", slow, far}} {
		c.call.wait(t)
		if !errors.Is(c.call.err, context.DeadlineExceeded) {
			t.Fatalf("%s: %d, %v; want its deadline", c.name, c.call.val, c.call.err)
		}
		if c.call.at.Before(c.deadline) {
			t.Fatalf("%s answered %v before its deadline", c.name, c.deadline.Sub(c.call.at))
		}
	}
	// The caller that came last with the nearest deadline was not held to
	// the deadline of the one before it in its batch.
	if !quick.at.Before(far) {
		t.Fatalf("the quick caller answered %v after start, at the slow one's deadline", quick.at.Sub(start))
	}
	patient.waitingUntilRelease(t, "a caller with no deadline", release, 5)
	answeredOnce(t, inFlight, patient, slow, quick)
	waitKeys(t, &g, 0)
}

// An owner's leaving answers at once every caller it stands for, in every
// group and batch, with its cause, and any caller that comes after; the
// other callers and the reads go on as before.
func TestOwnerLeaves(t *testing.T) {
	var g, other Group[string, int64]
	release := make(chan struct{})
	read, reads := heldRead(release, 5)
	var owner Owner
	far := time.Now().Add(time.Hour)
	inFlight := goCallBy(&g, "k", far, &owner, read) // starts the first read
	for reads.Load() == 0 {
		runtime.Gosched()
	}
	behind := goCallBy(&g, "k", far, &owner, read)
	stays := goCallBy(&g, "k", far, nil, read)
	elsewhere := goCallBy(&other, "j", far, &owner, func(context.Context) (int64, error) { <-release; return 1, nil })

	why := errors.New("connection closed")
	owner.Leave(why)
	for name, c := range map[string]*goCall{"in flight": inFlight, "behind": behind, "in another group": elsewhere} {
		c.wait(t)
		if !errors.Is(c.err, why) {
			t.Fatalf("%s: %d, %v; want the owner's cause", name, c.val, c.err)
		}
	}
	late := goCallBy(&g, "k", far, &owner, read)
	late.wait(t)
	if !errors.Is(late.err, why) {
		t.Fatalf("a caller after the owner left: %d, %v", late.val, late.err)
	}
	stays.waitingUntilRelease(t, "the caller of no owner", release, 5)
	testwait.Returns(t, g.Wait)
	testwait.Returns(t, other.Wait)
	answeredOnce(t, inFlight, behind, stays, elsewhere, late)
	owner.mu.Lock()
	first := owner.first
	owner.mu.Unlock()
	if first != nil {
		t.Fatal("the owner keeps callers after leaving")
	}
	waitKeys(t, &g, 0)
	waitKeys(t, &other, 0)
}

// A caller answered by its read leaves its owner's list: an owner of a
// long connection holds only the callers still waiting.
func TestOwnerHoldsOnlyWhoWaits(t *testing.T) {
	var g Group[string, int64]
	var owner Owner
	for range 100 {
		c := goCallBy(&g, "k", time.Now().Add(time.Hour), &owner, func(context.Context) (int64, error) { return 1, nil })
		c.wait(t)
	}
	owner.mu.Lock()
	first := owner.first
	owner.mu.Unlock()
	if first != nil {
		t.Fatal("the owner still lists callers that were answered")
	}
	waitKeys(t, &g, 0)
}

// A caller whose deadline passes or whose owner leaves just as its read
// ends is answered exactly once, and no key is left behind.
func TestWaitRacesTheRead(t *testing.T) {
	for round := range 300 {
		var g Group[string, int64]
		new(fakeClock).withFresh(&g)
		release := make(chan struct{})
		read, reads := heldRead(release, 0)
		var owner Owner
		first := goCallBy(&g, "k", time.Time{}, nil, read)
		for reads.Load() == 0 {
			runtime.Gosched()
		}
		deadline := time.Now().Add(time.Duration(round%4) * 50 * time.Microsecond)
		early := goCallBy(&g, "k", deadline, &owner, read)
		leaving := goCallBy(&g, "k", time.Time{}, &owner, read)
		go owner.Leave(nil)
		close(release)
		for _, c := range []*goCall{first, early, leaving} {
			c.wait(t)
		}
		testwait.Returns(t, g.Wait)
		time.Sleep(time.Millisecond)
		for _, c := range []*goCall{early, leaving} {
			if n := c.answers.Load(); n != 1 {
				t.Fatalf("round %d: a caller answered %d times", round, n)
			}
			if c.err != nil && !errors.Is(c.err, context.DeadlineExceeded) && !errors.Is(c.err, context.Canceled) {
				t.Fatalf("round %d: %v", round, c.err)
			}
		}
		waitKeys(t, &g, 0)
	}
}
