package session

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A database that hangs (connections open, nothing answered) while a
// turn publishes and its sequence numbers need a reservation: once the
// pool's watch has seen the database gone, each publish gives up at
// once (the update is lost and counted, as any whose number could not
// be reserved), not after its reservation's 5 s, which held the turn
// and every publish of the session behind it; once the database answers
// the next publish reserves and goes out.
func TestPublishesDoNotWaitOnAHungDatabase(t *testing.T) {
	r := testenv.RelayPostgres(t, testenv.Postgres(t))
	var hung atomic.Bool
	testenv.StartRelay(t, r.Path, r.Target, func() testenv.RelayHook {
		return func(bool, []byte) bool {
			for hung.Load() {
				time.Sleep(5 * time.Millisecond)
			}
			return true
		}
	})
	// Before the relay's Close: its goroutines must not wait on.
	t.Cleanup(func() { hung.Store(false) })
	h := newHarnessOn(t, r.URL)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var down atomic.Bool
	go pg.Watch(ctx, h.pool, func(err error) { down.Store(err != nil) })
	id := h.newSession(alice, "")
	h.prompt(alice, id, "/say before the hang")
	ls := h.srv.holdExisting(id, 0)
	if ls == nil {
		t.Fatal("no live session after a turn")
	}
	defer h.srv.release(ls)
	// The block is spent: the next publish must reserve.
	ls.pubMu.Lock()
	ls.seqReserved = ls.seq
	ls.pubMu.Unlock()

	hung.Store(true)
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !down.Load() {
			return errors.New("the watch has not seen the database gone")
		}
		return nil
	})
	const n = 5
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			h.srv.publishChunk(ls, UpdateMessageChunk, "turn_hang", "x")
		}
	}()
	// A bound on a hang, not a timing: the five took 25 s before.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d publishes still held by the hung database after 10 s", n)
	}
	t.Logf("%d publishes gave up in %v", n, time.Since(start).Round(time.Millisecond))
	ls.pubMu.Lock()
	lost := ls.seqLost
	ls.pubMu.Unlock()
	if lost != n {
		t.Errorf("%d updates counted lost, want %d", lost, n)
	}

	hung.Store(false)
	eventually(t, func() error {
		h.srv.publishChunk(ls, UpdateMessageChunk, "turn_hang", "after")
		ls.pubMu.Lock()
		defer ls.pubMu.Unlock()
		if ls.seqLost != 0 || ls.seq >= ls.seqReserved {
			return errors.New("no reservation yet")
		}
		return nil
	})
}
