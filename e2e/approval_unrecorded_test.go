package e2e_test

import (
	"strings"
	"testing"
	"time"

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
