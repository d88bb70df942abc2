package session

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// wantStands fails unless resp says that the decision standing on its
// request is status with decision and surface (unset for the service's
// own outcomes).
func wantStands(t *testing.T, what string, resp *sessionv1.ApproveResponse, status sessionv1.ApprovalStatus, decision, surface string) {
	t.Helper()
	if resp.GetStatus() != status || resp.GetDecision() != decisionOf(decision) || resp.GetSurface() != surfaceOf(surface) {
		t.Fatalf("%s: answered %v; want the standing decision %v %q by %q", what, resp, status, decision, surface)
	}
}

// approveFrom is approveAs from a surface, under ctx.
func approveFrom(ctx context.Context, h *harness, id, reqID, decision, surface string) (*sessionv1.ApproveResponse, error) {
	return h.srv.Approve(ctx, &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: reqID,
		Decision: decisionOf(decision), Surface: surfaceOf(surface)})
}

type approveResult struct {
	resp *sessionv1.ApproveResponse
	err  error
}

// approveAsync runs approveFrom in a goroutine the test waits for.
func approveAsync(t *testing.T, ctx context.Context, h *harness, id, reqID, decision, surface string) <-chan approveResult {
	ch := make(chan approveResult, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		resp, err := approveFrom(ctx, h, id, reqID, decision, surface)
		ch <- approveResult{resp, err}
	})
	return ch
}

// holdDecisionWrite locks approval reqID's row in a transaction of the
// test's own, so that its decision's UPDATE waits; the caller commits
// or rolls it back.
func holdDecisionWrite(t *testing.T, h *harness, reqID string) pgx.Tx {
	t.Helper()
	lock, err := h.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Rollback(context.Background()) })
	if _, err := lock.Exec(context.Background(), "SELECT 1 FROM approvals WHERE request_id = $1 FOR UPDATE", reqID); err != nil {
		t.Fatal(err)
	}
	return lock
}

// writeWaits waits until a decision's UPDATE waits for the test's lock.
func writeWaits(t *testing.T, h *harness) {
	t.Helper()
	eventually(t, func() error {
		if h.count("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE approvals%' AND datname = current_database()") != 1 {
			return fmt.Errorf("the decision's write is not waiting for the test's lock")
		}
		return nil
	})
}

// expiring is a caller's context whose deadline passes when the test
// says (expire), as a gRPC caller's does: Done closes, Err is
// DeadlineExceeded.
type expiring struct {
	context.Context
	done   chan struct{}
	expire func()
}

func newExpiring() *expiring {
	e := &expiring{Context: context.Background(), done: make(chan struct{})}
	e.expire = sync.OnceFunc(func() { close(e.done) })
	return e
}

func (e *expiring) Done() <-chan struct{} { return e.done }

func (e *expiring) Err() error {
	select {
	case <-e.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Every already_decided answer says which decision stands: the one that
// won, as the turn acted on it, whether Approve found it in memory
// (decided and being stored, or acted on by a turn still running) or in
// the store (after the turn's end, or in a process started since, as
// another replica or a restart would find it), and the service's own
// outcomes (the timeout's, a cancelled turn's, a decision the store did
// not take). Before, already_decided said only that some other decision
// won: ApproveResponse had no field for which.
func TestApproveSaysWhichDecisionStands(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = time.Minute })
	guardEcho(h)
	decided := sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED

	t.Run("a person's", func(t *testing.T) {
		id, rec, res, ask := askingTurnThen(t, h, "\n/say after\n/sleep 60000")
		reqID := ask.str("request_id")

		// Decided in memory, its write held: a second decision waits
		// for the write and is told the first stands.
		lock := holdDecisionWrite(t, h, reqID)
		first := approveAsync(t, context.Background(), h, id, reqID, DecisionReject, SurfaceRPC)
		writeWaits(t, h)
		second := approveAsync(t, context.Background(), h, id, reqID, DecisionAllowOnce, SurfaceDurable)
		if err := lock.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := testwait.Recv(t, first)
		if r.err != nil || !r.resp.GetAcknowledged() || r.resp.GetAlreadyDecided() {
			t.Fatalf("first decision: %v %v", r.resp, r.err)
		}
		wantStands(t, "the first decision", r.resp, decided, DecisionReject, SurfaceRPC)
		r = testwait.Recv(t, second)
		if r.err != nil || r.resp.GetAcknowledged() || !r.resp.GetAlreadyDecided() {
			t.Fatalf("second decision: %v %v", r.resp, r.err)
		}
		wantStands(t, "a decision while the first was stored", r.resp, decided, DecisionReject, SurfaceRPC)

		// Acted on, its turn still running.
		rec.until(UpdateToolResult)
		resp, err := approveFrom(context.Background(), h, id, reqID, DecisionAllowAlways, SurfaceElicitation)
		if err != nil || !resp.GetAlreadyDecided() {
			t.Fatalf("a decision after the turn acted: %v %v", resp, err)
		}
		wantStands(t, "a decision after the turn acted", resp, decided, DecisionReject, SurfaceRPC)

		// The turn ended: from the store.
		if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
			t.Fatal(err)
		}
		rec.until(UpdateTurnComplete)
		testwait.Recv(t, res)
		resp, err = approveAs(h, id, reqID, DecisionAllowOnce)
		if err != nil || !resp.GetAlreadyDecided() {
			t.Fatalf("a decision after the turn's end: %v %v", resp, err)
		}
		wantStands(t, "a decision after the turn's end", resp, decided, DecisionReject, SurfaceRPC)

		// A process that never held the ask (another replica, or this
		// one restarted) reads it from the store.
		h.restart()
		resp, err = approveAs(h, id, reqID, DecisionAllowOnce)
		if err != nil || !resp.GetAlreadyDecided() {
			t.Fatalf("a decision in another process: %v %v", resp, err)
		}
		wantStands(t, "a decision in another process", resp, decided, DecisionReject, SurfaceRPC)
	})

	t.Run("the timeout's", func(t *testing.T) {
		h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "hasty", Provider: ProviderScripted,
			ApprovalRequired: []string{"echo"}, ApprovalTimeout: 50 * time.Millisecond}})
		id, rec, _ := sessionAfterATurn(h, "hasty")
		h.prompt(alice, id, `/tool echo {"text":"hi"}`)
		us := rec.until(UpdateTurnComplete)
		reqID := resentOf(t, "live", &sessionv1.ResendResponse{}, us, UpdateApprovalRequest).str("request_id")
		resp, err := approveAs(h, id, reqID, DecisionAllowOnce)
		if err != nil || !resp.GetAlreadyDecided() {
			t.Fatalf("a decision after the timeout: %v %v", resp, err)
		}
		wantStands(t, "a decision after the timeout", resp, sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT, "", "")
	})

	t.Run("a cancelled turn's", func(t *testing.T) {
		id, rec, res, ask := askingTurn(t, h)
		if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
			t.Fatal(err)
		}
		rec.until(UpdateTurnComplete)
		testwait.Recv(t, res)
		resp, err := approveAs(h, id, ask.str("request_id"), DecisionAllowOnce)
		if err != nil || !resp.GetAlreadyDecided() {
			t.Fatalf("a decision after the cancel: %v %v", resp, err)
		}
		wantStands(t, "a decision after the cancel", resp, sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED, "", "")
	})
}

// A caller whose deadline passes while its decision is being stored is
// told so (DeadlineExceeded, saying the decision may still be recorded
// and to send it again), and the store goes on without it, under the
// service's own bound: the decision is stored exactly once and acted on
// once, or, when the store does not take it, not acted on. A decision
// sent again (after the timeout, while the write is still held, and
// later) is answered from the outcome: already_decided with the decision
// that stands, never a second action. Before, the timed-out caller got
// an unclassified error, and a decision sent again while the first was
// being stored was answered already_decided at once, before anyone knew
// whether the first would stand.
func TestApproveWhoseCallerGaveUpWhileItWasStored(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = time.Minute })
	guardEcho(h)
	decided := sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED

	// gaveUp holds ask's decision write, makes allow_once's caller give
	// up while it is held and checks what that caller is told; then
	// sends the decision again, to be answered once the write ends.
	gaveUp := func(t *testing.T, id, reqID string) (lock pgx.Tx, again <-chan approveResult) {
		t.Helper()
		lock = holdDecisionWrite(t, h, reqID)
		caller := newExpiring()
		first := approveAsync(t, caller, h, id, reqID, DecisionAllowOnce, SurfaceRPC)
		writeWaits(t, h)
		caller.expire()
		r := testwait.Recv(t, first)
		if r.err == nil {
			t.Fatalf("a caller whose deadline passed during the store was answered %v", r.resp)
		}
		wantRefusal(t, r.err, codes.DeadlineExceeded, rpcerr.ReasonDependency, "may still be recorded")
		return lock, approveAsync(t, context.Background(), h, id, reqID, DecisionAllowOnce, SurfaceRPC)
	}

	t.Run("stored", func(t *testing.T) {
		id, rec, res, ask := askingTurn(t, h)
		reqID := ask.str("request_id")
		lock, again := gaveUp(t, id, reqID)
		if err := lock.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := testwait.Recv(t, again)
		if r.err != nil || r.resp.GetAcknowledged() || !r.resp.GetAlreadyDecided() {
			t.Fatalf("the decision sent again: %v %v", r.resp, r.err)
		}
		wantStands(t, "the decision sent again", r.resp, decided, DecisionAllowOnce, SurfaceRPC)
		us := rec.until(UpdateTurnComplete)
		testwait.Recv(t, res)
		if result := resentOf(t, "live", &sessionv1.ResendResponse{}, us, UpdateToolResult); result.str("status") != toolCompleted {
			t.Fatalf("the call ended %q: %q", result.str("status"), result.str("raw_output"))
		}
		var decidedAt time.Time
		if err := h.pool.QueryRow(context.Background(), "SELECT decided_at FROM approvals WHERE request_id = $1", reqID).Scan(&decidedAt); err != nil {
			t.Fatal(err)
		}
		// Sent again after the turn, even another decision: no second
		// action, the row as it was.
		for _, d := range []string{DecisionAllowOnce, DecisionReject} {
			resp, err := approveAs(h, id, reqID, d)
			if err != nil || resp.GetAcknowledged() || !resp.GetAlreadyDecided() {
				t.Fatalf("%s after the turn: %v %v", d, resp, err)
			}
			wantStands(t, d+" after the turn", resp, decided, DecisionAllowOnce, SurfaceRPC)
		}
		if status, decision := approvalRow(t, h, reqID); status != "decided" || decision != DecisionAllowOnce {
			t.Fatalf("the row reads %s %q", status, decision)
		}
		if n := h.count("SELECT count(*) FROM approvals WHERE request_id = $1 AND decided_at = $2", reqID, decidedAt); n != 1 {
			t.Fatalf("the decision was stored again")
		}
		if n := h.count("SELECT count(*) FROM tool_calls WHERE session_id = $1 AND name = 'echo' AND status = $2", id, toolCompleted); n != 1 {
			t.Fatalf("the call ran %d times", n)
		}
	})

	t.Run("settled while held", func(t *testing.T) {
		id, rec, res, ask := askingTurn(t, h)
		reqID := ask.str("request_id")
		lock, again := gaveUp(t, id, reqID)
		// The holder settles the row itself: the decision's UPDATE then
		// matches nothing, and the call is not run.
		if _, err := lock.Exec(context.Background(), "UPDATE approvals SET status = 'cancelled' WHERE request_id = $1", reqID); err != nil {
			t.Fatal(err)
		}
		if err := lock.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := testwait.Recv(t, again)
		if r.err != nil || r.resp.GetAcknowledged() || !r.resp.GetAlreadyDecided() {
			t.Fatalf("the decision sent again: %v %v", r.resp, r.err)
		}
		wantStands(t, "the decision sent again", r.resp, sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED, "", "")
		us := rec.until(UpdateTurnComplete)
		testwait.Recv(t, res)
		if result := resentOf(t, "live", &sessionv1.ResendResponse{}, us, UpdateToolResult); result.str("status") != toolCancelled || result.str("raw_output") != settledNote {
			t.Fatalf("the call ended %q: %q", result.str("status"), result.str("raw_output"))
		}
	})
}
