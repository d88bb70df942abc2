// Package testwait bounds the waits of a test body: a wait that never ends
// (its sender stopped early, a condition that a loaded machine never
// reached) fails its test, by name, instead of stalling the package until
// go test's timeout and leaving only a goroutine dump to guess from.
//
// Bound is a failure bound, never a performance assertion: long enough for
// anything a test waits on a loaded two-core machine (the e2e tests' waits
// on a whole stack included), short enough that a hang is named well
// within go test's timeout.
package testwait

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// Bound is how long Recv and Returns wait.
const Bound = time.Minute

// Recv receives from ch, failing t if nothing comes within Bound. Call it
// from the test's own goroutine (it may call t.Fatalf).
func Recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(Bound)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("nothing received within %v", Bound)
		panic("unreachable")
	}
}

// Returns calls wait (a WaitGroup's Wait, say) and fails t if it has not
// returned within Bound. The goroutine that calls wait is left behind
// then, as the test has failed.
func Returns(t testing.TB, wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait()
	}()
	timer := time.NewTimer(Bound)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("still waiting after %v", Bound)
	}
}

// Progress polls count every poll until it reports done, failing t if
// the count has not moved for Bound. The wait lasts as long as the work
// it waits on keeps going, so a loaded machine's slowness (a stream read
// at a tenth of its usual pace) is never a failure, while a stream that
// stops short (an update lost, a connection closed) is one, named with
// where it stopped. Call it from the test's own goroutine; count may call
// t.Fatalf.
func Progress(t testing.TB, poll time.Duration, count func() (n int64, done bool)) {
	t.Helper()
	last, moved := int64(-1), time.Now()
	for {
		n, done := count()
		if done {
			return
		}
		if n != last {
			last, moved = n, time.Now()
		} else if time.Since(moved) > Bound {
			t.Fatalf("no progress for %v: stopped at %d", Bound, n)
		}
		time.Sleep(poll)
	}
}

// Goroutines returns the stack of every goroutine, one entry each (its
// "goroutine N [state]:" line, then its frames), read whole however many
// there are: what a test counts goroutines in a given state or function
// from, where a fixed buffer would cut the dump short.
func Goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}
