package session

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// resentOf returns the update of type typ among us, failing when there
// is none or when the resend lost the range.
func resentOf(t *testing.T, what string, resp *sessionv1.ResendResponse, us []update, typ string) update {
	t.Helper()
	if resp.GetLost() != "" {
		t.Fatalf("%s: lost %q", what, resp.GetLost())
	}
	for _, u := range us {
		if u.Type == typ {
			return u
		}
	}
	t.Fatalf("%s: no %s in %s", what, typ, types(us))
	return update{}
}

// An ask cancelled with its turn is sent again cancelled (by the
// service) in the gap after the ask gave it up and before the turn's
// end stored it cancelled: the turn had forgotten it in memory and its
// row was still pending, so it went out undecided, and the gateway put
// to its clients again an approval for a call its turn had cancelled.
// turnEnding holds the turn in that gap.
func TestACancelledAskIsSentAgainCancelledBeforeItsTurnEndIsStored(t *testing.T) {
	h := newHarness(t)
	guardEcho(h)
	id, rec, prev := sessionAfterATurn(h, "guarded")

	ending, release := holdTurnEnd(t, id)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: `/tool echo {"text":"hi"}`})
	rec.until(UpdateApprovalRequest)
	cancel()
	testwait.Recv(t, ending)
	resp, us := h.resend(id, prev, 0)
	ask := resentOf(t, "the turn ending", resp, us, UpdateApprovalRequest)
	if ask.Params["decision"] != decisionCancelled || ask.Params["decided_by"] != surfaceService {
		t.Errorf("the ask cancelled with its turn, whose end is not stored yet, sent again with decision %v by %v, want %q by %q",
			ask.Params["decision"], ask.Params["decided_by"], decisionCancelled, surfaceService)
	}
	release()
	testwait.Recv(t, res)
	end := rec.until(UpdateTurnComplete)
	resp, us = h.resend(id, prev, 0)
	ask = resentOf(t, "the turn ended", resp, us, UpdateApprovalRequest)
	if ask.Params["decision"] != decisionCancelled || ask.Params["decided_by"] != surfaceService || us[len(us)-1].Seq != end[len(end)-1].Seq {
		t.Fatalf("the turn ended: sent again %v", us)
	}
}

// An approval whose decision the database refused to store is not acted
// on: its call does not run and ends cancelled, the ask is sent again
// cancelled by the service, while the turn runs and after its end, and
// an allow_always given for it allows nothing more. Before, the call ran
// on the person's decision while the row stayed pending: the ask went
// out again undecided while the turn ran, and cancelled once its end
// marked it so, beside the tool_result of a call that ran. The fault is
// real: a trigger of the test's own database refuses the decision.
func TestAnApprovalWhoseDecisionWasNotStoredIsNotActedOn(t *testing.T) {
	h := newHarness(t)
	guardEcho(h)
	refuseDecisions(h)
	id, rec, prev := sessionAfterATurn(h, "guarded")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: `/tool echo {"text":"hi"}` + "\n/say after\n/sleep 60000"})
	live := rec.until(UpdateApprovalRequest)
	ask := live[len(live)-1]
	// The decision's write is held (the test locks the row) while a
	// Resend asks: the turn has not acted on the decision yet, and will
	// not, so the ask must not be sent again with it.
	lock, err := h.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(context.Background(), "SELECT 1 FROM approvals WHERE request_id = $1 FOR UPDATE", ask.str("request_id")); err != nil {
		t.Fatal(err)
	}
	// Approve answers once the write is done, so not before the lock
	// goes; then with the refusal (TestApproveAnswersOnceItsDecisionIsStored).
	approved := make(chan error, 1)
	go func() {
		_, err := h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: ask.str("request_id"),
			Decision: decisionOf(DecisionAllowAlways), Surface: surfaceOf(SurfaceRPC)})
		approved <- err
	}()
	eventually(t, func() error {
		if h.count("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE approvals%' AND datname = current_database()") != 1 {
			return fmt.Errorf("the decision's write is not waiting for the test's lock")
		}
		return nil
	})
	incarnation := h.incarnation(id)
	inFlight := make(chan *sessionv1.ResendResponse, 1)
	go func() {
		resp, err := h.srv.Resend(context.Background(), &sessionv1.ResendRequest{SessionId: id, Incarnation: incarnation, AfterSeq: prev})
		if err != nil {
			t.Errorf("resend while the decision is being stored: %v", err)
		}
		inFlight <- resp
	}()
	var early *sessionv1.ResendResponse
	select {
	case early = <-inFlight:
		// Answered while the write is held: this is not a wait for
		// an outcome, only a chance to see a wrong answer.
	case <-time.After(500 * time.Millisecond):
	}
	if err := lock.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if early == nil {
		early = testwait.Recv(t, inFlight)
	}
	wantRefusal(t, testwait.Recv(t, approved), codes.Unavailable, rpcerr.ReasonDependency, "could not be recorded")
	for _, b := range early.GetUpdates() {
		u, err := bus.DecodeSessionUpdate(b, id, incarnation)
		if err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		if err := json.Unmarshal(u.JSON, &p); err != nil {
			t.Fatal(err)
		}
		if bus.UpdateTypeName(u.Type) == UpdateApprovalRequest && (p["decision"] != decisionCancelled || p["decided_by"] != surfaceService) {
			t.Fatalf("sent again while its decision was being stored (and then refused): decision %v by %v, want %q by %q",
				p["decision"], p["decided_by"], decisionCancelled, surfaceService)
		}
	}
	live = rec.until(UpdateToolResult)
	result := live[len(live)-1]
	agree := func(what string, us []update) {
		t.Helper()
		a := resentOf(t, what, &sessionv1.ResendResponse{}, us, UpdateApprovalRequest)
		r := resentOf(t, what, &sessionv1.ResendResponse{}, us, UpdateToolResult)
		if r.str("status") != toolCancelled || a.Params["decision"] != decisionCancelled || a.Params["decided_by"] != surfaceService {
			t.Fatalf("%s: the call's tool_result says %q (%q); its approval_request sent again says decision %v by %v; want %q, and %q by %q",
				what, r.str("status"), r.str("raw_output"), a.Params["decision"], a.Params["decided_by"], toolCancelled, decisionCancelled, surfaceService)
		}
	}
	if result.str("status") != toolCancelled || result.str("raw_output") != unrecordedNote {
		t.Fatalf("the call approved by a decision not stored ended %q: %q", result.str("status"), result.str("raw_output"))
	}
	resp, us := h.resend(id, prev, 0)
	if resp.GetLost() != "" {
		t.Fatalf("the turn running: lost %q", resp.GetLost())
	}
	agree("sent again, the turn running", us)
	ls := h.srv.lookupLive(id)
	ls.mu.Lock()
	always := ls.alwaysAllowed["echo"]
	ls.mu.Unlock()
	if always {
		t.Errorf("an allow_always not stored allows echo for the session")
	}
	cancel()
	testwait.Recv(t, res)
	rec.until(UpdateTurnComplete)
	resp, us = h.resend(id, prev, 0)
	if resp.GetLost() != "" {
		t.Fatalf("the turn ended: lost %q", resp.GetLost())
	}
	agree("sent again, the turn ended", us)
	if n := h.count("SELECT count(*) FROM approvals WHERE session_id = $1 AND status = 'cancelled'", id); n != 1 {
		t.Errorf("%d approvals stored cancelled, want 1", n)
	}
}

// holdTurnEnd holds session id's next turn in its end, before the end is
// stored (turnEnding): ending is closed once the turn is there, and the
// turn goes on at release (or at the test's end).
func holdTurnEnd(t *testing.T, id string) (ending <-chan struct{}, release func()) {
	t.Helper()
	reached, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = sync.OnceFunc(func() { close(proceed) })
	hook := func(sessionID string) {
		if sessionID == id {
			once.Do(func() { close(reached) })
			<-proceed
		}
	}
	turnEnding.Store(&hook)
	t.Cleanup(func() { turnEnding.Store(nil); release() })
	return reached, release
}
