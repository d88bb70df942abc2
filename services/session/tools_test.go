package session

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A turn with the built-in echo: tool_call, then tool_result, in order,
// with the snake_case fields and their camelCase aliases; the provider
// gets the result back and the turn goes on. An unknown tool is a failed
// result, not a failed turn.
func TestEchoToolTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	const prompt = "/say calling\n/tool echo {\"x\": [1, 2]}\n/tool nosuch {}\n/say done"
	resp := h.prompt(alice, id, prompt)
	if resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || resp.GetContent() != "calling\ndone" {
		t.Fatalf("prompt %v", resp)
	}
	us := rec.until(UpdateTurnComplete)
	checkSeq(t, us)
	if got := types(us); got != "agent_message_chunk tool_call tool_result tool_call tool_result agent_message_chunk turn_complete" {
		t.Fatalf("updates %s", got)
	}
	call, result := us[1], us[2]
	in, _ := call.Params["raw_input"].(map[string]any)
	if call.str("name") != "echo" || call.str("tool_call_id") == "" || call.str("toolCallId") != call.str("tool_call_id") ||
		in == nil || call.Params["rawInput"] == nil {
		t.Fatalf("tool_call %v", call.Params)
	}
	if result.str("tool_call_id") != call.str("tool_call_id") || result.str("toolCallId") != call.str("tool_call_id") ||
		result.str("raw_output") != `{"x":[1,2]}` || result.str("rawOutput") != `{"x":[1,2]}` || result.str("status") != toolCompleted {
		t.Fatalf("tool_result %v", result.Params)
	}
	if us[4].str("status") != toolFailed || us[4].str("raw_output") != "Unknown tool `nosuch`" {
		t.Fatalf("unknown tool's result %v", us[4].Params)
	}

	var name, status, output string
	if err := h.pool.QueryRow(context.Background(), "SELECT name, status, raw_output FROM tool_calls WHERE tool_call_id = $1",
		call.str("tool_call_id")).Scan(&name, &status, &output); err != nil || status != toolCompleted || output != `{"x":[1,2]}` {
		t.Fatalf("stored tool call: %s %s %s %v", name, status, output, err)
	}
	// The transcript shows the turn in the order its updates did: the
	// text said before the tool calls, their results, the text after.
	// It stored the tool rows first and the turn's text as one row last.
	msgs, _ := h.srv.Messages(context.Background(), &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
	var rows []string
	for _, m := range msgs.GetMessages() {
		rows = append(rows, m.GetRole()+": "+m.GetContent())
	}
	want := []string{"user: " + prompt, "assistant: calling", "tool: echo: {\"x\":[1,2]}", "tool: nosuch: Unknown tool `nosuch`", "assistant: \ndone"}
	if strings.Join(rows, "|") != strings.Join(want, "|") {
		t.Fatalf("transcript %q, want %q", rows, want)
	}
}

// Tools in approval_required wait for a decision: allow runs the tool,
// reject and the timeout deny it (the turn goes on), the first of two
// decisions wins, allow_always stops asking.
func TestApprovals(t *testing.T) {
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}, ApprovalTimeout: 30 * time.Second}})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "hasty", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}, ApprovalTimeout: 200 * time.Millisecond}})
	const script = "/tool echo {\"cmd\":\"rm -rf /tmp/x\"}\n/say after"

	// run starts a turn and returns its approval request.
	run := func(alias string) (string, *recorder, <-chan promptResult, update) {
		id := h.newSession(alice, alias)
		rec := h.record(id)
		res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: script})
		us := rec.until(UpdateApprovalRequest)
		if got := types(us); got != "tool_call approval_request" {
			t.Fatalf("before the decision: %s", got)
		}
		ask := us[1]
		if ask.str("request_id") == "" || ask.str("tool_name") != "echo" || ask.str("tool_call_id") != us[0].str("tool_call_id") ||
			ask.str("arguments_summary") != `{"cmd":"rm -rf /tmp/x"}` || ask.Params["timeout_secs"] == nil {
			t.Fatalf("approval_request %v", ask.Params)
		}
		return id, rec, res, ask
	}
	approveErr := func(id, reqID, decision, surface string) (*sessionv1.ApproveResponse, error) {
		return h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{
			Principal: alice, SessionId: id, RequestId: reqID, Decision: decisionOf(decision), Surface: surfaceOf(surface), Replacement: "use ls instead",
		})
	}
	approve := func(id, reqID, decision, surface string) *sessionv1.ApproveResponse {
		resp, err := approveErr(id, reqID, decision, surface)
		if err != nil {
			t.Fatalf("approve: %v", err)
		}
		return resp
	}
	finish := func(rec *recorder, res <-chan promptResult) (update, *sessionv1.PromptResponse) {
		us := rec.until(UpdateTurnComplete)
		if got := types(us); got != "tool_result agent_message_chunk turn_complete" {
			t.Fatalf("after the decision: %s", got)
		}
		r := testwait.Recv(t, res)
		if r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || r.resp.GetContent() != "after" {
			t.Fatalf("prompt %v %v", r.resp, r.err)
		}
		return us[0], r.resp
	}

	t.Run("allow", func(t *testing.T) {
		id, rec, res, ask := run("guarded")
		if a := approve(id, ask.str("request_id"), DecisionAllowOnce, SurfaceElicitation); !a.GetAcknowledged() || a.GetAlreadyDecided() {
			t.Fatalf("approve %v", a)
		}
		result, _ := finish(rec, res)
		if result.str("status") != toolCompleted || result.str("raw_output") != `{"cmd":"rm -rf /tmp/x"}` {
			t.Fatalf("allowed result %v", result.Params)
		}
		var decision, surface string
		if err := h.pool.QueryRow(context.Background(), "SELECT decision, surface FROM approvals WHERE request_id = $1",
			ask.str("request_id")).Scan(&decision, &surface); err != nil || decision != DecisionAllowOnce || surface != SurfaceElicitation {
			t.Fatalf("stored decision %s %s %v", decision, surface, err)
		}
	})
	t.Run("reject", func(t *testing.T) {
		id, rec, res, ask := run("guarded")
		approve(id, ask.str("request_id"), DecisionReject, "")
		result, _ := finish(rec, res)
		if result.str("status") != toolDenied || result.str("raw_output") != "Denied: the user rejected this tool call" {
			t.Fatalf("rejected result %v", result.Params)
		}
	})
	t.Run("reject_with_edit", func(t *testing.T) {
		id, rec, res, ask := run("guarded")
		approve(id, ask.str("request_id"), DecisionRejectWithEdit, SurfaceDurable)
		result, _ := finish(rec, res)
		if result.str("status") != toolDenied || result.str("raw_output") != "Denied: the user rejected this tool call and answered instead: use ls instead" {
			t.Fatalf("rejected result %v", result.Params)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		id, rec, res, ask := run("hasty")
		if ask.Params["timeout_secs"] != float64(1) {
			t.Fatalf("timeout_secs %v", ask.Params["timeout_secs"])
		}
		result, _ := finish(rec, res)
		if result.str("status") != toolDenied || result.str("raw_output") != "Denied: no approval within 1 seconds" {
			t.Fatalf("timed-out result %v", result.Params)
		}
		if a := approve(id, ask.str("request_id"), DecisionAllowOnce, ""); a.GetAcknowledged() || !a.GetAlreadyDecided() {
			t.Fatalf("late approve %v", a)
		}
	})
	t.Run("first decision wins", func(t *testing.T) {
		id, rec, res, ask := run("guarded")
		decisions := []string{DecisionAllowOnce, DecisionReject, DecisionAllowOnce, DecisionReject}
		answers := make([]*sessionv1.ApproveResponse, len(decisions))
		var wg sync.WaitGroup
		for i, d := range decisions {
			wg.Go(func() {
				var err error // not approve: its t.Fatal belongs to the test's goroutine
				if answers[i], err = approveErr(id, ask.str("request_id"), d, SurfaceRPC); err != nil {
					t.Errorf("approve: %v", err)
				}
			})
		}
		wg.Wait()
		winner := -1
		for i, a := range answers {
			if a.GetAcknowledged() == a.GetAlreadyDecided() {
				t.Fatalf("answer %d: %v", i, a)
			}
			if a.GetAcknowledged() {
				if winner >= 0 {
					t.Fatalf("two decisions won: %d and %d", winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatal("no decision won")
		}
		result, _ := finish(rec, res)
		want := toolCompleted
		if decisions[winner] == DecisionReject {
			want = toolDenied
		}
		if result.str("status") != want {
			t.Fatalf("winner %s, result %v", decisions[winner], result.Params)
		}
		if a := approve(id, ask.str("request_id"), DecisionAllowOnce, ""); !a.GetAlreadyDecided() {
			t.Fatalf("answer after the turn: %v", a)
		}
	})
	t.Run("allow_always", func(t *testing.T) {
		id, rec, res, ask := run("guarded")
		approve(id, ask.str("request_id"), DecisionAllowAlways, "")
		finish(rec, res)
		h.prompt(alice, id, script)
		if got := types(rec.until(UpdateTurnComplete)); got != "tool_call tool_result agent_message_chunk turn_complete" {
			t.Fatalf("asked again after allow_always: %s", got)
		}
	})
	t.Run("cancel while waiting", func(t *testing.T) {
		id, rec, res, ask := run("guarded")
		if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
			t.Fatal(err)
		}
		us := rec.until(UpdateTurnComplete)
		if got := types(us); got != "tool_result turn_complete" || us[0].str("status") != toolCancelled || us[1].str("outcome") != OutcomeCancelled {
			t.Fatalf("after cancel: %s %v", got, us)
		}
		testwait.Recv(t, res)
		if a := approve(id, ask.str("request_id"), DecisionAllowOnce, ""); !a.GetAlreadyDecided() {
			t.Fatalf("answer after cancel: %v", a)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		id := h.newSession(alice, "guarded")
		_, err := h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: "ap_nope", Decision: sessionv1.Decision_DECISION_ALLOW_ONCE})
		wantRefusal(t, err, codes.NotFound, rpcerr.ReasonNotFound, "Unknown approval request `ap_nope`")
		_, err = h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: "ap_nope", Decision: sessionv1.Decision(99)})
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`decision`")
		_, err = h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: bob, SessionId: id, RequestId: "ap_nope", Decision: sessionv1.Decision_DECISION_ALLOW_ONCE})
		wantRefusal(t, err, codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, id)
	})
}

// A tool the agent's tools list leaves out is refused by policy, in those
// words, not reported unknown.
func TestToolRefusedByPolicySaysSo(t *testing.T) {
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "narrow", Provider: ProviderScripted, Tools: []string{"other"}}})
	id := h.newSession(alice, "narrow")
	rec := h.record(id)
	h.prompt(alice, id, "/tool echo {}\n/tool nosuch {}")
	us := rec.until(UpdateTurnComplete)
	var outputs []string
	for _, u := range us {
		if u.Type == UpdateToolResult {
			outputs = append(outputs, u.str("raw_output"))
		}
	}
	want := []string{"Tool `echo` is not allowed for agent `narrow` (agents.narrow.tools)", "Unknown tool `nosuch`"}
	if !slices.Equal(outputs, want) {
		t.Fatalf("tool results %q, want %q", outputs, want)
	}
}
