package durablebridge

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// A token read that fails (config hung just after its Live answered, at
// the bridge's start) is read again until it succeeds: before, the
// bridge set no token and refused every token call until the next
// config write announced a change, which might never come.
func TestTokenReadAgainAfterAFailure(t *testing.T) {
	var calls atomic.Int32
	read := func(context.Context) (string, error) {
		if calls.Add(1) <= 3 {
			return "", errors.New("config: not answering")
		}
		return "tok-" + "abc", nil
	}
	var mu sync.Mutex
	var set []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	wake := make(chan struct{}, 1)
	go func() {
		defer close(done)
		ts := TokenSource{Read: read, Set: func(tok string) { mu.Lock(); set = append(set, tok); mu.Unlock() }, Wake: wake, Retry: time.Millisecond}
		ts.Follow(ctx, ts.Load(ctx))
	}()
	t.Cleanup(func() { cancel(); testwait.Recv(t, done) })
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(set) == 0 || set[len(set)-1] != "tok-abc" {
			return errors.New("the token is not set yet")
		}
		return nil
	})
	if n := calls.Load(); n != 4 {
		t.Fatalf("%d reads, want 4 (three failures, then the token)", n)
	}
	// Read once more on a change, not again otherwise.
	wake <- struct{}{}
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if calls.Load() != 5 {
			return errors.New("not read again on the change")
		}
		return nil
	})
}
