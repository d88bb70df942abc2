package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// An approval whose decision the database refuses to store runs nothing,
// on the real binaries through the socket: the client accepts the
// elicitation, the session service cannot store the allow (a trigger of
// the stack's own database refuses it), and the call ends cancelled,
// saying so, with its ask stored cancelled. Before, the call ran on a
// decision the record did not hold, and the ask was stored (and sent
// again) as cancelled by the service beside the result of a call that
// ran.
func TestAnApprovalDecisionNotStoredRunsNothing(t *testing.T) {
	t.Parallel()
	s, _, db := durableStack(t, "--set", `agents.default.approval_required=["echo"]`, "--set", "agents.default.approval_timeout_secs=60")
	ctx := e2e.Context(t, 30*time.Second)
	refuseApprovalDecisions(t, ctx, db)
	v := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	id := v.newSession("")
	ups := approvalTurn(t, v, id, `{"action":"accept","content":{"choice":"allow_once"}}`)
	if out := toolResult(t, ups); strings.Contains(out, `"y":2`) || !strings.Contains(out, "could not be recorded") {
		t.Fatalf("the call approved by a decision the database refused: %q", out)
	}
	var status string
	if err := db.QueryRow(ctx, "SELECT status FROM session.approvals WHERE session_id = $1", id).Scan(&status); err != nil || status != "cancelled" {
		t.Fatalf("the ask is stored %q (%v), want cancelled", status, err)
	}
}

// refuseApprovalDecisions makes the stack's own database refuse every
// approval decision's write, with a trigger on session.approvals.
func refuseApprovalDecisions(t *testing.T, ctx context.Context, db *pgx.Conn) {
	t.Helper()
	for _, q := range []string{
		`CREATE FUNCTION public.refuse_decisions() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.status = 'decided' THEN
				RAISE EXCEPTION 'the test refuses approval decisions';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER refuse_decisions BEFORE UPDATE ON session.approvals FOR EACH ROW EXECUTE FUNCTION public.refuse_decisions()`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// session/approve on a decision the database refuses to store answers an
// error saying so, through the socket: -32603 naming the session service
// and what failed, and the call is cancelled. Before, it answered
// {acknowledged: true}, and only the tool_result told otherwise.
func TestSessionApproveSaysItsDecisionWasNotStored(t *testing.T) {
	t.Parallel()
	s, _, db := durableStack(t, "--set", `agents.default.approval_required=["echo"]`, "--set", "agents.default.approval_timeout_secs=60")
	ctx := e2e.Context(t, 30*time.Second)
	refuseApprovalDecisions(t, ctx, db)
	v := newConv(t, s, nil)
	id := v.newSession("")
	prompt := v.send("session/prompt", map[string]any{"session_id": id, "prompt": `/tool echo {"y":2}`})
	var ups []update
	approve := ""
	for {
		f := v.next()
		if u, ok := v.upd(f); ok {
			ups = append(ups, u)
			if u.Type == "approval_request" {
				approve = v.send("session/approve", map[string]any{"session_id": id, "request_id": u.RequestID, "decision": "allow_once"})
			}
			continue
		}
		if approve != "" && string(f.ID) == approve {
			if f.Error == nil || f.Error.Code != -32603 || !strings.HasPrefix(f.Error.Message, "session: the decision on approval request") ||
				!strings.Contains(f.Error.Message, "could not be recorded") || !strings.Contains(f.Error.Message, "its tool call was cancelled") {
				t.Fatalf("session/approve of a decision the database refused answered %s %+v", f.Result, f.Error)
			}
			approve = "answered"
			continue
		}
		if string(f.ID) == prompt {
			break
		}
	}
	if approve != "answered" {
		t.Fatalf("the turn ended before session/approve answered: %+v", ups)
	}
	if out := toolResult(t, ups); strings.Contains(out, `"y":2`) || !strings.Contains(out, "could not be recorded") {
		t.Fatalf("the call approved by a decision the database refused: %q", out)
	}
}
