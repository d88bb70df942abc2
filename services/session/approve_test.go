package session

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// refuseDecisions makes the test's own database refuse every approval
// decision's write (a trigger): the store's real failure, not a stub.
func refuseDecisions(h *harness) {
	h.exec(`CREATE FUNCTION refuse_decisions() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.status = 'decided' THEN
				RAISE EXCEPTION 'the test refuses approval decisions';
			END IF;
			RETURN NEW;
		END $$`)
	h.exec(`CREATE TRIGGER refuse_decisions BEFORE UPDATE ON approvals FOR EACH ROW EXECUTE FUNCTION refuse_decisions()`)
}

// askingTurn starts a turn of a new session of alice's (alias guarded)
// whose echo call waits for an approval, and returns the ask.
func askingTurn(t testing.TB, h *harness) (id string, rec *recorder, res <-chan promptResult, ask update) {
	return askingTurnThen(t, h, "\n/say after")
}

// askingTurnThen is askingTurn with then the turn's script after the
// call (a sleep keeps the turn running once the call ended).
func askingTurnThen(t testing.TB, h *harness, then string) (id string, rec *recorder, res <-chan promptResult, ask update) {
	t.Helper()
	id, rec, _ = sessionAfterATurn(h, "guarded")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	res = h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: `/tool echo {"text":"hi"}` + then})
	live := rec.until(UpdateApprovalRequest)
	return id, rec, res, live[len(live)-1]
}

func approveAs(h *harness, id, reqID, decision string) (*sessionv1.ApproveResponse, error) {
	return h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: reqID,
		Decision: decisionOf(decision), Surface: surfaceOf(SurfaceRPC)})
}

// approvalRow reads a stored approval's status and decision.
func approvalRow(t *testing.T, h *harness, reqID string) (status, decision string) {
	t.Helper()
	var d *string
	if err := h.pool.QueryRow(context.Background(), "SELECT status, decision FROM approvals WHERE request_id = $1", reqID).Scan(&status, &d); err != nil {
		t.Fatalf("read approval %s: %v", reqID, err)
	}
	if d != nil {
		decision = *d
	}
	return status, decision
}

// Approve answers once the decision is stored: acknowledged means the
// row says so already, and a decision the database refuses is answered
// with an error that says so (the call is cancelled), through the
// gateway's table as -32603 naming what failed, not "session failed".
// Before, Approve answered acknowledged before the turn tried to store
// the decision, and the refusal reached the client only as the call's
// tool_result.
func TestApproveAnswersOnceItsDecisionIsStored(t *testing.T) {
	h := newHarness(t)
	guardEcho(h)

	t.Run("stored", func(t *testing.T) {
		id, rec, res, ask := askingTurn(t, h)
		resp, err := approveAs(h, id, ask.str("request_id"), DecisionAllowOnce)
		if err != nil || !resp.GetAcknowledged() || resp.GetAlreadyDecided() {
			t.Fatalf("approve: %v %v", resp, err)
		}
		// Read at once: Approve answered after the write.
		if status, decision := approvalRow(t, h, ask.str("request_id")); status != "decided" || decision != DecisionAllowOnce {
			t.Fatalf("acknowledged, and the row reads %s %q", status, decision)
		}
		rec.until(UpdateTurnComplete)
		testwait.Recv(t, res)
	})

	t.Run("refused", func(t *testing.T) {
		refuseDecisions(h)
		t.Cleanup(func() { h.exec("DROP TRIGGER refuse_decisions ON approvals"); h.exec("DROP FUNCTION refuse_decisions") })
		id, rec, res, ask := askingTurn(t, h)
		resp, err := approveAs(h, id, ask.str("request_id"), DecisionAllowOnce)
		if err == nil {
			t.Fatalf("a decision the database refused answered %v", resp)
		}
		wantRefusal(t, err, codes.Unavailable, rpcerr.ReasonDependency, "could not be recorded")
		we := errmap.ToWire("session", err)
		if we.Code != jsonrpc.CodeInternal || !strings.HasPrefix(we.Message, "session: the decision on approval request `"+ask.str("request_id")+"` could not be recorded") ||
			!strings.Contains(we.Message, "its tool call was cancelled") {
			t.Fatalf("the client is told %d %q", we.Code, we.Message)
		}
		us := rec.until(UpdateTurnComplete)
		result := resentOf(t, "live", &sessionv1.ResendResponse{}, us, UpdateToolResult)
		if result.str("status") != toolCancelled || result.str("raw_output") != unrecordedNote {
			t.Fatalf("the call ended %q: %q", result.str("status"), result.str("raw_output"))
		}
		testwait.Recv(t, res)
		// Asked again, it stands cancelled.
		again, err := approveAs(h, id, ask.str("request_id"), DecisionAllowOnce)
		if err != nil || again.GetAcknowledged() || !again.GetAlreadyDecided() {
			t.Fatalf("approve again: %v %v", again, err)
		}
		wantStands(t, "approve again", again, sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED, "", "")
		if status, _ := approvalRow(t, h, ask.str("request_id")); status != "cancelled" {
			t.Fatalf("the ask is stored %s, want cancelled", status)
		}
	})
}

// A decision whose UPDATE matches no pending row was not stored: the
// row is missing (its insert failed) or another writer settled it. The
// call is not run on it, and Approve says so: an error when there is no
// row, already_decided when another decision stands. Before, no row
// matched counted as stored: Approve acknowledged and the call ran.
func TestApproveOfAnAskNoLongerPendingInTheStore(t *testing.T) {
	h := newHarness(t)
	guardEcho(h)
	for _, tc := range []struct {
		name, sql    string
		wantErr      bool
		wantOutput   string
		wantStatuses string
	}{
		{"row missing", "DELETE FROM approvals WHERE request_id = $1", true, unrecordedNote, ""},
		{"settled elsewhere", "UPDATE approvals SET status = 'cancelled' WHERE request_id = $1", false, settledNote, "cancelled"},
		{"decided elsewhere", "UPDATE approvals SET status = 'decided', decision = 'reject', surface = 'durable' WHERE request_id = $1", false, settledNote, "cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, rec, res, ask := askingTurn(t, h)
			h.exec(tc.sql, ask.str("request_id"))
			resp, err := approveAs(h, id, ask.str("request_id"), DecisionAllowOnce)
			switch {
			case tc.wantErr:
				if err == nil {
					t.Fatalf("a decision with no row to store it in answered %v", resp)
				}
				wantRefusal(t, err, codes.Unavailable, rpcerr.ReasonDependency, "the approval request itself was not stored")
			case err != nil || resp.GetAcknowledged() || !resp.GetAlreadyDecided():
				t.Fatalf("a decision on an ask settled in the store answered %v %v, want already_decided", resp, err)
			default:
				// The turn acts on neither: the call ends cancelled.
				wantStands(t, "a decision on an ask settled in the store", resp, sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED, "", "")
			}
			us := rec.until(UpdateTurnComplete)
			result := resentOf(t, "live", &sessionv1.ResendResponse{}, us, UpdateToolResult)
			if result.str("status") != toolCancelled || result.str("raw_output") != tc.wantOutput {
				t.Fatalf("the call ended %q: %q", result.str("status"), result.str("raw_output"))
			}
			testwait.Recv(t, res)
			if tc.wantStatuses != "" {
				if status, _ := approvalRow(t, h, ask.str("request_id")); status != tc.wantStatuses {
					t.Fatalf("stored %s, want %s", status, tc.wantStatuses)
				}
			}
		})
	}
}

// Every id Approve (and GetApproval) is sent is checked before it
// reaches SQL, and an approval of another session is unknown to this
// one and stays undecided. Before, a malformed id was looked up and
// answered not found.
func TestApproveChecksItsIds(t *testing.T) {
	h := newHarness(t)
	guardEcho(h)
	id, rec, res, ask := askingTurn(t, h)
	mine := h.newSession(alice, "guarded")

	for _, bad := range []string{"ap/../x", "ap x", "ap_'; --", strings.Repeat("a", 129)} {
		_, err := approveAs(h, id, bad, DecisionAllowOnce)
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`request_id`")
		_, err = h.srv.GetApproval(context.Background(), &sessionv1.GetApprovalRequest{Principal: alice, SessionId: id, RequestId: bad})
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`request_id`")
		_, err = approveAs(h, bad, ask.str("request_id"), DecisionAllowOnce)
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`session_id`")
		_, err = h.srv.GetApproval(context.Background(), &sessionv1.GetApprovalRequest{Principal: alice, SessionId: bad, RequestId: ask.str("request_id")})
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`session_id`")
	}
	_, err := approveAs(h, id, "", DecisionAllowOnce)
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`request_id` is required")

	// Another session's ask, named through this one.
	_, err = approveAs(h, mine, ask.str("request_id"), DecisionAllowOnce)
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonNotFound, "Unknown approval request `"+ask.str("request_id")+"`")
	if status, _ := approvalRow(t, h, ask.str("request_id")); status != "pending" {
		t.Fatalf("an approval decided through another session: %s", status)
	}
	// Still the one to decide it.
	if resp, err := approveAs(h, id, ask.str("request_id"), DecisionReject); err != nil || !resp.GetAcknowledged() {
		t.Fatalf("approve: %v %v", resp, err)
	}
	rec.until(UpdateTurnComplete)
	testwait.Recv(t, res)
}

// A decision racing its turn's cancel is answered as the store ends:
// acknowledged when it won (the row holds it), already_decided when the
// cancel did (the row ends cancelled); never an error, never both. In
// the gap where the cancel gave the ask up but the turn's end is not
// stored yet, it is already decided.
func TestApproveRacingItsTurnsCancel(t *testing.T) {
	h := newHarness(t)
	guardEcho(h)

	t.Run("race", func(t *testing.T) {
		var won, lost int
		for round := 0; round < 6; round++ {
			id, rec, res, ask := askingTurn(t, h)
			var resp *sessionv1.ApproveResponse
			var aerr, cerr error
			var wg sync.WaitGroup
			wg.Go(func() { resp, aerr = approveAs(h, id, ask.str("request_id"), DecisionAllowOnce) })
			wg.Go(func() {
				_, cerr = h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id})
			})
			wg.Wait()
			if aerr != nil || cerr != nil {
				t.Fatalf("round %d: approve %v, cancel %v", round, aerr, cerr)
			}
			rec.until(UpdateTurnComplete)
			testwait.Recv(t, res)
			status, decision := approvalRow(t, h, ask.str("request_id"))
			switch {
			case resp.GetAcknowledged() == resp.GetAlreadyDecided():
				t.Fatalf("round %d: answered %v", round, resp)
			case resp.GetAcknowledged() && (status != "decided" || decision != DecisionAllowOnce):
				t.Fatalf("round %d: acknowledged, and the row reads %s %q", round, status, decision)
			case resp.GetAlreadyDecided() && status != "cancelled":
				t.Fatalf("round %d: already decided, and the row reads %s %q", round, status, decision)
			}
			if resp.GetAcknowledged() {
				won++
			} else {
				lost++
			}
		}
		t.Logf("the decision won %d rounds, the cancel %d", won, lost)
	})

	t.Run("in the turn's end", func(t *testing.T) {
		id, rec, res, ask := askingTurn(t, h)
		ending, release := holdTurnEnd(t, id)
		cancelled := make(chan error, 1)
		go func() {
			_, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id})
			cancelled <- err
		}()
		testwait.Recv(t, ending)
		resp, err := approveAs(h, id, ask.str("request_id"), DecisionAllowOnce)
		if err != nil || resp.GetAcknowledged() || !resp.GetAlreadyDecided() {
			t.Fatalf("approve in the turn's end: %v %v, want already_decided", resp, err)
		}
		release()
		if err := testwait.Recv(t, cancelled); err != nil {
			t.Fatal(err)
		}
		rec.until(UpdateTurnComplete)
		testwait.Recv(t, res)
		if status, _ := approvalRow(t, h, ask.str("request_id")); status != "cancelled" {
			t.Fatalf("stored %s, want cancelled", status)
		}
	})
}
