package session

import (
	"context"
	"fmt"
	"testing"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// storedSeq reads the session's stored update sequence bound.
func (h *harness) storedSeq(id string) int64 {
	h.t.Helper()
	var n int64
	if err := h.pool.QueryRow(context.Background(), "SELECT update_seq FROM sessions WHERE session_id = $1", id).Scan(&n); err != nil {
		h.t.Fatalf("read update_seq: %v", err)
	}
	return n
}

// A turn reserves the update numbers its first updates use in the
// transaction that starts it, so its first chunk goes out without a
// database write of its own. The bound is read while the turn is running
// and has published nothing (the provider sleeps first): it is already
// raised. Before, the first update reserved them itself, a write and a
// commit on its way out, and the bound read here was still 0.
func TestTurnReservesItsUpdateNumbers(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	done := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/sleep 60000\n/say never"})
	eventually(t, func() error {
		if st := h.state(alice, id); st != "running" {
			return fmt.Errorf("state %s", st)
		}
		return nil
	})
	if got := h.storedSeq(id); got != seqBlock {
		t.Fatalf("stored bound %d while the turn runs before its first update, want %d", got, seqBlock)
	}
	if _, err := h.srv.Cancel(ctx, &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil {
		t.Fatal(r.err)
	}
	first := rec.until("turn_complete")
	checkSeq(t, first)
	if first[0].Seq != 1 {
		t.Fatalf("first update numbered %d", first[0].Seq)
	}

	// With more than half a block left, the next turn reserves nothing
	// and numbers on.
	second := func(text string) []update {
		h.prompt(alice, id, text)
		return rec.until("turn_complete")
	}
	us := second("/say again")
	if us[0].Seq != first[len(first)-1].Seq+1 {
		t.Fatalf("second turn numbered from %d after %d", us[0].Seq, first[len(first)-1].Seq)
	}
	if got := h.storedSeq(id); got != seqBlock {
		t.Fatalf("stored bound %d after a turn with room left, want %d", got, seqBlock)
	}

	// A clean restart stores the last number used; the next turn starts a
	// new block from there and numbers on without a gap.
	last := us[len(us)-1].Seq
	h.restart()
	if got := h.storedSeq(id); got != last {
		t.Fatalf("stored bound %d after a clean stop, want the last used %d", got, last)
	}
	us = second("/say after restart")
	if us[0].Seq != last+1 {
		t.Fatalf("after restart numbered from %d, want %d", us[0].Seq, last+1)
	}
	checkSeq(t, us)
	if got := h.storedSeq(id); got != last+seqBlock {
		t.Fatalf("stored bound %d after the restarted turn, want %d", got, last+seqBlock)
	}
}
