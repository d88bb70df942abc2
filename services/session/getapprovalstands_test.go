package session

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// GetApproval says the decision that stands, as Approve does. A decision
// the store did not take is not acted on, and from then on the ask stands
// cancelled: while its turn still runs (the row reads as the failed write
// left it, pending or decided by another writer, until the turn's end
// marks it), after the turn's end and in a process started since. Before,
// GetApproval read the row in the first window: pending (or the other
// writer's decision) of an ask whose call had already ended cancelled.
// The durable bridge reads it once the call's tool_result is out, and
// left the phone's ask open (or closed it as decided by the program).
func TestGetApprovalSaysWhichDecisionStands(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = time.Minute })
	guardEcho(h)
	cancelled := sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED

	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, reqID string)
		row     string // the row's status while the turn runs
	}{
		{"refused by the store", func(t *testing.T, _ string) {
			refuseDecisions(h)
			t.Cleanup(func() {
				h.exec("DROP TRIGGER IF EXISTS refuse_decisions ON approvals")
				h.exec("DROP FUNCTION IF EXISTS refuse_decisions")
			})
		}, "pending"},
		{"decided by another writer", func(t *testing.T, reqID string) {
			h.exec("UPDATE approvals SET status = 'decided', decision = 'reject', surface = 'durable', decided_at = now() WHERE request_id = $1", reqID)
		}, "decided"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, rec, res, ask := askingTurnThen(t, h, "\n/say after\n/sleep 60000")
			reqID := ask.str("request_id")
			tc.prepare(t, reqID)
			if resp, err := approveAs(h, id, reqID, DecisionAllowOnce); err == nil && resp.GetAcknowledged() {
				t.Fatal("a decision the store did not take was acknowledged")
			}

			// both checks that GetApproval and a decision sent again say
			// the same decision stands: cancelled, none reported (a
			// cancelled row may keep the decision it undid).
			both := func(when string) {
				t.Helper()
				v := approvalOf(t, h, id, reqID)
				if v.GetStatus() != cancelled || v.GetDecision() != sessionv1.Decision_DECISION_UNSPECIFIED || v.GetSurface() != sessionv1.Surface_SURFACE_UNSPECIFIED {
					t.Fatalf("GetApproval %s: %v; want the standing decision %v, with no decision or surface", when, v, cancelled)
				}
				resp, err := approveAs(h, id, reqID, DecisionReject)
				if err != nil || !resp.GetAlreadyDecided() {
					t.Fatalf("Approve %s: %v %v", when, resp, err)
				}
				wantStands(t, "Approve "+when, resp, cancelled, "", "")
			}

			// The call ended cancelled; the turn sleeps on.
			rec.until(UpdateToolResult)
			if status, _ := approvalRow(t, h, reqID); status != tc.row {
				t.Fatalf("the row reads %s while the turn runs; the case is a row still %s", status, tc.row)
			}
			both("while the turn runs")

			if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
				t.Fatal(err)
			}
			rec.until(UpdateTurnComplete)
			testwait.Recv(t, res)
			both("after the turn's end")

			h.restart()
			both("after a restart")
		})
	}
}
