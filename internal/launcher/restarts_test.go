package launcher

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// TestRestartCountsSaidAgain: a count is published when it happens and
// every process's latest count again each interval, until the context
// ends.
func TestRestartCountsSaidAgain(t *testing.T) {
	var mu sync.Mutex
	var got []string
	published := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	n := newRestartNotices(func(name string, count int) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, name+"="+strconv.Itoa(count))
		return nil
	})
	n.restarted("session", 1)
	n.restarted("session", 2)
	n.restarted("config", 1)
	if p := published(); !slices.Equal(p, []string{"session=1", "session=2", "config=1"}) {
		t.Fatalf("published at once %v", p)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.repeat(ctx, 10*time.Millisecond)
	}()
	// Twice each, the latest count only.
	testenv.Eventually(t, 5*time.Second, 5*time.Millisecond, func() error {
		again := published()[3:]
		for _, g := range again {
			if g != "session=2" && g != "config=1" {
				return fmt.Errorf("said again %q, not a latest count", g)
			}
		}
		for _, want := range []string{"session=2", "config=1"} {
			if k := len(slices.DeleteFunc(slices.Clone(again), func(g string) bool { return g != want })); k < 2 {
				return fmt.Errorf("%s said again %d times in %d repeats", want, k, len(again))
			}
		}
		return nil
	})
	cancel()
	<-done
	after := len(published())
	time.Sleep(30 * time.Millisecond)
	if p := published(); len(p) != after {
		t.Fatalf("published after the context ended: %v", p[after:])
	}
}
