package session

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every caller of a coalesced read gets a read that started after it
// arrived: here, one that sees the write it made just before calling.
func TestCoalescedReadIsNeverOlderThanTheCall(t *testing.T) {
	var writes, reads atomic.Int64
	c := coalesced[int64]{timeout: 5 * time.Second}
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
				got, err := c.do(context.Background(), read)
				if err != nil || got < mine {
					t.Errorf("read %d after write %d (err %v)", got, mine, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d calls answered by %d reads", callers*rounds, reads.Load())
}

// A waiting caller whose context ends leaves with its cause; a leader's
// cancellation does not fail the read it runs for the others.
func TestCoalescedReadCancellation(t *testing.T) {
	c := coalesced[int]{timeout: 5 * time.Second}
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
	go func() { _, err := c.do(leaderCtx, read); leader <- err }()
	<-started

	// A caller waiting for the next read gives up.
	why := errors.New("client left")
	waitCtx, cancelWait := context.WithCancelCause(context.Background())
	waiter := make(chan error, 1)
	go func() { _, err := c.do(waitCtx, read); waiter <- err }()
	cancelWait(why)
	if err := <-waiter; !errors.Is(err, why) {
		t.Fatalf("cancelled waiter: %v, want its cause", err)
	}

	cancelLeader()
	close(release)
	if err := <-leader; err != nil {
		t.Fatalf("leader's read failed with its own cancellation: %v", err)
	}
	// The batch the waiter left is run by the next caller.
	if v, err := c.do(context.Background(), read); err != nil || v != 7 {
		t.Fatalf("next read: %d, %v", v, err)
	}
}
