package session

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

type getApprovalResult struct {
	v   *sessionv1.ApprovalView
	err error
}

// getApprovalAsync runs GetApproval under ctx in a goroutine the test
// waits for.
func getApprovalAsync(t *testing.T, ctx context.Context, h *harness, id, reqID string) <-chan getApprovalResult {
	ch := make(chan getApprovalResult, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		resp, err := h.srv.GetApproval(ctx, &sessionv1.GetApprovalRequest{Principal: operator, SessionId: id, RequestId: reqID})
		ch <- getApprovalResult{resp.GetApproval(), err}
	})
	return ch
}

// readWhileWritten starts GetApproval of reqID under ctx and returns once
// it waits for the decision's write (approvalWaits), or has answered
// without waiting; the channel gives its answer either way.
func readWhileWritten(t *testing.T, ctx context.Context, h *harness, id, reqID string) <-chan getApprovalResult {
	t.Helper()
	waiting := make(chan struct{}, 1)
	hook := func(r string) {
		if r == reqID {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}
	approvalWaits.Store(&hook)
	t.Cleanup(func() { approvalWaits.Store(nil) })
	read := getApprovalAsync(t, ctx, h, id, reqID)
	timer := time.NewTimer(testwait.Bound)
	defer timer.Stop()
	select {
	case <-waiting:
		return read
	case r := <-read:
		answered := make(chan getApprovalResult, 1)
		answered <- r
		return answered
	case <-timer.C:
		t.Fatalf("GetApproval neither answered nor waited within %v", testwait.Bound)
		return nil
	}
}

// GetApproval of an ask decided in memory whose decision is still being
// written says the decision only once the store took it: it waits for
// the write (as Approve does), within its caller's deadline, and says
// the decision that then stands: the one taken when it was stored,
// cancelled when the store refused it or another writer had settled the
// row. A caller whose deadline passes first is told what is known, that
// nothing is settled yet (pending), never the decision not yet stored.
// Before, it answered at once with the decision taken in memory: decided
// allow_once of an ask that then ended cancelled.
func TestGetApprovalWhileItsDecisionIsWritten(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = time.Minute })
	guardEcho(h)
	decided := sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED
	cancelled := sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED
	pending := sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING

	// asking starts a turn that asks for its echo call and sleeps on
	// after it; the returned func cancels the turn and waits for its end.
	asking := func(t *testing.T) (id, reqID string, rec *recorder, end func()) {
		t.Helper()
		id, rec, res, ask := askingTurnThen(t, h, "\n/say after\n/sleep 60000")
		return id, ask.str("request_id"), rec, func() {
			t.Helper()
			if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
				t.Fatal(err)
			}
			rec.until(UpdateTurnComplete)
			testwait.Recv(t, res)
		}
	}
	// allowHeld sends allow_once for reqID with its row locked (lock),
	// and returns once the decision's write waits on that lock.
	allowHeld := func(t *testing.T, id, reqID string) (lock pgx.Tx, approved <-chan approveResult) {
		t.Helper()
		lock = holdDecisionWrite(t, h, reqID)
		approved = approveAsync(t, context.Background(), h, id, reqID, DecisionAllowOnce, SurfaceRPC)
		writeWaits(t, h)
		return lock, approved
	}
	wantView := func(t *testing.T, what string, r getApprovalResult, status sessionv1.ApprovalStatus, decision, surface string) {
		t.Helper()
		if r.err != nil {
			t.Fatalf("GetApproval %s: %v", what, r.err)
		}
		if r.v.GetStatus() != status || r.v.GetDecision() != decisionOf(decision) || r.v.GetSurface() != surfaceOf(surface) {
			t.Fatalf("GetApproval %s: %v; want %v %q by %q", what, r.v, status, decision, surface)
		}
	}

	t.Run("refused by the store", func(t *testing.T) {
		refuseDecisions(h)
		t.Cleanup(func() {
			h.exec("DROP TRIGGER IF EXISTS refuse_decisions ON approvals")
			h.exec("DROP FUNCTION IF EXISTS refuse_decisions")
		})
		id, reqID, rec, end := asking(t)
		lock, approved := allowHeld(t, id, reqID)
		read := readWhileWritten(t, context.Background(), h, id, reqID)
		// Released, the UPDATE goes on and the trigger refuses it.
		if err := lock.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := testwait.Recv(t, approved); r.err == nil {
			t.Fatalf("a decision the store refused was answered %v", r.resp)
		}
		wantView(t, "while the refused decision was written", testwait.Recv(t, read), cancelled, "", "")
		if result := rec.until(UpdateToolResult); result[len(result)-1].str("status") != toolCancelled {
			t.Fatalf("the call ended %q", result[len(result)-1].str("status"))
		}
		end()
	})

	t.Run("settled by another writer", func(t *testing.T) {
		id, reqID, _, end := asking(t)
		lock, approved := allowHeld(t, id, reqID)
		read := readWhileWritten(t, context.Background(), h, id, reqID)
		if _, err := lock.Exec(context.Background(), "UPDATE approvals SET status = 'decided', decision = 'reject', surface = 'durable', decided_at = now() WHERE request_id = $1", reqID); err != nil {
			t.Fatal(err)
		}
		if err := lock.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := testwait.Recv(t, approved); r.err != nil || !r.resp.GetAlreadyDecided() {
			t.Fatalf("a decision whose row another writer settled: %v %v", r.resp, r.err)
		}
		wantView(t, "while the decision settled elsewhere was written", testwait.Recv(t, read), cancelled, "", "")
		end()
	})

	t.Run("stored", func(t *testing.T) {
		id, reqID, _, end := asking(t)
		lock, approved := allowHeld(t, id, reqID)
		read := readWhileWritten(t, context.Background(), h, id, reqID)
		if err := lock.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := testwait.Recv(t, approved); r.err != nil || !r.resp.GetAcknowledged() {
			t.Fatalf("a decision stored: %v %v", r.resp, r.err)
		}
		r := testwait.Recv(t, read)
		wantView(t, "while the decision was written", r, decided, DecisionAllowOnce, SurfaceRPC)
		if r.v.GetDecidedAt() == nil {
			t.Fatalf("GetApproval while the decision was written: %v; decided with no decided_at", r.v)
		}
		end()
	})

	t.Run("the caller's deadline first", func(t *testing.T) {
		id, reqID, _, end := asking(t)
		lock, approved := allowHeld(t, id, reqID)
		caller := newExpiring()
		read := readWhileWritten(t, caller, h, id, reqID)
		caller.expire()
		r := testwait.Recv(t, read)
		wantView(t, "whose deadline passed while the decision was written", r, pending, "", "")
		if err := lock.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := testwait.Recv(t, approved); r.err != nil || !r.resp.GetAcknowledged() {
			t.Fatalf("a decision stored: %v %v", r.resp, r.err)
		}
		wantView(t, "once the decision was stored", getApprovalResult{approvalOf(t, h, id, reqID), nil}, decided, DecisionAllowOnce, SurfaceRPC)
		end()
	})
}
