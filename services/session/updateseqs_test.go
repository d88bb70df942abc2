package session

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// UpdateSeqs names the seq of the last update each session published, as
// the bus carried it: 0 before any, the turn_complete's after a turn,
// the same once the session's live half is evicted from memory, and -1
// for a session that is not there or is of another incarnation. A gateway
// whose bus link came back keeps the followers of a session whose last
// update received is that number.
func TestUpdateSeqsNamesTheLastUpdatePublished(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	inc := h.incarnation(id)
	rec := h.record(id)
	ask := func(sessions ...*sessionv1.SessionIncarnation) []int64 {
		t.Helper()
		resp, err := h.srv.UpdateSeqs(context.Background(), &sessionv1.UpdateSeqsRequest{Sessions: sessions})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetSeqs()
	}
	this := &sessionv1.SessionIncarnation{SessionId: id, Incarnation: inc}
	if got := ask(this); fmt.Sprint(got) != "[0]" {
		t.Fatalf("before any update: %v", got)
	}
	made, err := h.srv.NewSession(context.Background(), &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if !made.GetCreated() || made.UpdateSeq == nil || made.GetUpdateSeq() != 0 {
		t.Fatalf("a session made: created %v, update_seq %v, want 0", made.GetCreated(), made.UpdateSeq)
	}

	h.prompt(alice, id, "/say hello")
	us := rec.until("turn_complete")
	last := us[len(us)-1].Seq
	got := ask(this,
		&sessionv1.SessionIncarnation{SessionId: id, Incarnation: inc + 1},
		&sessionv1.SessionIncarnation{SessionId: "sess_none", Incarnation: 1})
	if want := fmt.Sprint([]int64{last, -1, -1}); fmt.Sprint(got) != want {
		t.Fatalf("after a turn whose turn_complete is seq %d: %v, want %v", last, got, want)
	}

	// Attach and a resuming session/new name the same number, which a
	// gateway keeps to compare with UpdateSeqs's after a bus reconnect.
	att, err := h.srv.Attach(context.Background(), &sessionv1.AttachRequest{Principal: alice, SessionId: id, ConnectionId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if att.UpdateSeq == nil || att.GetUpdateSeq() != last {
		t.Fatalf("Attach named update_seq %v, want %d", att.UpdateSeq, last)
	}
	res, err := h.srv.NewSession(context.Background(), &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "default", SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetCreated() || res.UpdateSeq == nil || res.GetUpdateSeq() != last {
		t.Fatalf("resuming session/new: created %v, update_seq %v, want %d", res.GetCreated(), res.UpdateSeq, last)
	}

	// Evicted from memory, the session's number is its stored bound,
	// lowered to the last one used.
	if n := h.srv.evictIdle(time.Now().Add(time.Hour)); n != 1 {
		t.Fatalf("%d evicted", n)
	}
	if got := ask(this); fmt.Sprint(got) != fmt.Sprint([]int64{last}) {
		t.Fatalf("after eviction: %v, want [%d]", got, last)
	}

	many := make([]*sessionv1.SessionIncarnation, MaxUpdateSeqs+1)
	for i := range many {
		many[i] = this
	}
	_, err = h.srv.UpdateSeqs(context.Background(), &sessionv1.UpdateSeqsRequest{Sessions: many})
	if err == nil {
		t.Fatalf("%d sessions asked about at once: no error", len(many))
	}
}

// askSeqs is h's UpdateSeqs about one session of incarnation inc.
func askSeqs(t *testing.T, h *harness, id string, inc int64) int64 {
	t.Helper()
	resp, err := h.srv.UpdateSeqs(context.Background(), &sessionv1.UpdateSeqsRequest{
		Sessions: []*sessionv1.SessionIncarnation{{SessionId: id, Incarnation: inc}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetSeqs()[0]
}

// A crash (SIGKILL) between turns leaves the session's stored bound at
// the block it reserved; the process started after it answers the last
// number published, the turn_complete's, stored with the turn's end: a
// gateway keeps the follower that received it. So do Attach, which
// makes a live half that has numbered nothing, and that half itself.
// Before, the new process answered the reserved bound, 1,024: the
// gateway closed every follower, nothing lost.
func TestUpdateSeqsAfterACrashNamesTheLastUpdatePublished(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	inc := h.incarnation(id)
	rec := h.record(id)
	h.prompt(alice, id, "/say one two")
	us := rec.until("turn_complete")
	last := us[len(us)-1].Seq

	h.crash()
	if got := askSeqs(t, h, id, inc); got != last {
		t.Fatalf("after a crash between turns: %d, want the turn_complete's %d", got, last)
	}
	att, err := h.srv.Attach(context.Background(), &sessionv1.AttachRequest{Principal: alice, SessionId: id, ConnectionId: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if att.GetUpdateSeq() != last {
		t.Fatalf("Attach after a crash named update_seq %d, want %d", att.GetUpdateSeq(), last)
	}
	row, err := h.srv.store.session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ls, release := h.srv.hold(context.Background(), row)
	defer release()
	if got := askSeqs(t, h, id, inc); got != last {
		t.Fatalf("with a live half that numbered nothing: %d, want %d", got, last)
	}

	// The new process's first update follows its reservation
	// (renumbered): the number answered is its own from then on.
	h.prompt(alice, id, "/say three")
	us = rec.until("turn_complete")
	if got, want := askSeqs(t, h, id, inc), us[len(us)-1].Seq; got != want || ls.seq != want {
		t.Fatalf("after the new process's turn: %d (live half %d), want %d", got, ls.seq, want)
	}
}

// While a turn runs, the last number published is not stored (the turn
// numbers its updates without a write): a crash mid-turn is answered
// with a number past what the follower received, never the number of a
// chunk it saw, as the turn's later updates may have gone out and been
// lost.
func TestUpdateSeqsAfterACrashMidTurnIsPastWhatWasReceived(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	inc := h.incarnation(id)
	rec := h.record(id)
	h.prompt(alice, id, "/say one")
	rec.until("turn_complete")
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say two\n/sleep 60000\n/say three"})
	seen := rec.next().Seq
	stored, err := h.srv.store.updateSeqs(context.Background(), []string{id})
	if err != nil {
		t.Fatal(err)
	}
	if got := stored[id].last; got <= seen {
		t.Fatalf("the stored number while a turn runs is %d, not past the chunk received (%d)", got, seen)
	}

	h.crash()
	if u := rec.next(); u.Type != UpdateTurnComplete {
		t.Fatalf("recovery published %s", u.Type)
	}
	if got := askSeqs(t, h, id, inc); got <= seen {
		t.Fatalf("after a crash mid-turn: %d, not past the chunk received (%d)", got, seen)
	}
}

// A turn that has begun (its start reserved a block in its own
// transaction and cleared the stored last number) but numbered nothing
// yet: the session's number is still the last one published, 0 on a
// fresh session. Answered by the stored row, it was the reservation
// (1,024): a gateway whose bus link came back in that window (a
// TURN_STARTED lost in the drop) closed the turn's prompter and every
// follower, nothing lost (seen in CI:
// TestTurnStartLostOnTheBusStillReachesItsPrompter).
func TestUpdateSeqsWhileATurnBeginsIsTheLastPublished(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	inc := h.incarnation(id)
	rec := h.record(id)
	done := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/sleep 1500\n/say late"})
	testenv.Eventually(t, wait, 5*time.Millisecond, func() error {
		if ls := h.srv.lookupLive(id); ls == nil || ls.running() == nil {
			return errors.New("no turn running")
		}
		return nil
	})
	if got := askSeqs(t, h, id, inc); got != 0 {
		t.Fatalf("while a turn begins with nothing numbered: %d, want 0", got)
	}
	if r := <-done; r.err != nil {
		t.Fatal(r.err)
	}
	if u := rec.until("turn_complete"); u[0].Seq != 1 {
		t.Fatalf("the turn's first update numbered %d, want 1", u[0].Seq)
	}
}

// A session's first turn admitted while UpdateSeqs runs, between its
// reads of the live halves (the session had none yet: the first prompt
// makes it) and of the stored rows (the turn's start had reserved the
// next block and cleared the last number published): before, the answer
// was the block's bound, 1,024, a number no update took, and the
// gateway asking after a bus reconnect (e2e
// TestTurnStartLostOnTheBusStillReachesItsPrompter) took it for updates
// lost and closed the session's followers. It is the last number
// published, 0.
func TestUpdateSeqsWhileTheFirstTurnIsAdmittedIsTheLastPublished(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	inc := h.incarnation(id)
	rec := h.record(id)
	if ls := h.srv.lookupLive(id); ls != nil {
		t.Fatal("a session never prompted has a live half")
	}
	var done <-chan promptResult
	hook := func() {
		if done != nil {
			return
		}
		done = h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/sleep 1500\n/say late"})
		testenv.Eventually(t, wait, 5*time.Millisecond, func() error {
			if ls := h.srv.lookupLive(id); ls == nil || ls.running() == nil {
				return errors.New("no turn running")
			}
			return nil
		})
	}
	updateSeqsBetweenReads.Store(&hook)
	t.Cleanup(func() { updateSeqsBetweenReads.Store(nil) })
	got := askSeqs(t, h, id, inc)
	updateSeqsBetweenReads.Store(nil)
	if got != 0 {
		t.Fatalf("with the session's first turn admitted while UpdateSeqs read: %d, want 0", got)
	}
	if r := <-done; r.err != nil {
		t.Fatal(r.err)
	}
	if u := rec.until("turn_complete"); u[0].Seq != 1 {
		t.Fatalf("the turn's first update numbered %d, want 1", u[0].Seq)
	}
}

// A crash mid-turn, then a crash of the process that recovered the cut
// turn before another turn ended: the third process answers the
// recovered turn_complete's number, stored by the recovery with the
// turn's end, so a gateway keeps the follower that received it. Before,
// the recovery stored no number, and the third process answered the
// bound the recovery had reserved to publish it (1,023 past it): the
// gateway closed the follower, nothing lost.
func TestUpdateSeqsAfterACrashOfARecoveryIsTheRecoveredEnd(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	inc := h.incarnation(id)
	rec := h.record(id)
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say two\n/sleep 60000\n/say three"})
	seen := rec.next().Seq

	h.crash()
	end := rec.next()
	if end.Type != UpdateTurnComplete || end.Seq <= seen {
		t.Fatalf("recovery published %s numbered %d after the chunk's %d", end.Type, end.Seq, seen)
	}
	if got := askSeqs(t, h, id, inc); got != end.Seq {
		t.Fatalf("after the recovery: %d, want its turn_complete's %d", got, end.Seq)
	}
	h.crash()
	if got := askSeqs(t, h, id, inc); got != end.Seq {
		t.Fatalf("after a crash of the recovering process: %d, want the recovered turn_complete's %d", got, end.Seq)
	}
}

// As above for a turn of a surface recovery does not restore (a
// channel's): it is marked interrupted, not finished, and its session
// made idle apart; the number of the turn_complete recovery publishes is
// stored all the same.
func TestUpdateSeqsAfterACrashOfAnotherSurfacesRecoveryIsTheRecoveredEnd(t *testing.T) {
	h := newHarness(t)
	created, err := h.srv.NewSession(context.Background(), &sessionv1.NewSessionRequest{Principal: alice, InteractionSurface: "channel:test"})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSessionId()
	inc := h.incarnation(id)
	rec := h.record(id)
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say partial\n/sleep 60000"})
	rec.next()

	h.crash()
	end := rec.next()
	if end.Type != UpdateTurnComplete {
		t.Fatalf("recovery published %s", end.Type)
	}
	h.crash()
	if got := askSeqs(t, h, id, inc); got != end.Seq {
		t.Fatalf("after a crash of the recovering process: %d, want the recovered turn_complete's %d", got, end.Seq)
	}
}
