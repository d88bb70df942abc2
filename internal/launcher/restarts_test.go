package launcher

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestRestartCountsSaidAgain: a count is published when it happens and
// again each interval, the latest per process, until the context ends.
func TestRestartCountsSaidAgain(t *testing.T) {
	var mu sync.Mutex
	var got []string
	n := newRestartNotices(func(name string, count int) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, name+"="+string(rune('0'+count)))
		return nil
	})
	n.restarted("session", 1)
	n.restarted("session", 2)
	n.restarted("config", 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.repeat(ctx, 10*time.Millisecond)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k >= 3+4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 7 || got[0] != "session=1" || got[1] != "session=2" || got[2] != "config=1" {
		t.Fatalf("published %v", got)
	}
	for _, g := range got[3:] {
		if g != "session=2" && g != "config=1" {
			t.Fatalf("said again %q, not the latest count (all: %v)", g, got)
		}
	}
	after := len(got)
	mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	mu.Lock()
	if len(got) != after {
		t.Fatalf("published after the context ended: %v", got[after:])
	}
}
