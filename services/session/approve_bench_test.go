package session

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/ids"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// BenchmarkApprove times Approve's round trip on an ask a turn waits on:
// each op starts a turn whose echo call asks, then Approve, then waits
// for the turn's end; approve_us/op is Approve's own round trip, the op
// the whole turn. The op is timed whole so that -benchtime counts turns:
// with the timer stopped around all but Approve, make bench's 2 s of
// Approve alone took thousands of turns a case and ran out of the
// package's 10 minutes. allow_always takes a session of its own each op
// (the tool is allowed always after it). "store" times the one UPDATE
// that stores a decision, on a pending row of its own, as the yardstick:
// Approve answers after it once it waits for the decision to be stored.
func BenchmarkApprove(b *testing.B) {
	h := newHarness(b)
	guardEcho(h)
	for _, d := range []string{DecisionAllowOnce, DecisionReject, DecisionAllowAlways} {
		b.Run(d, func(b *testing.B) {
			var id string
			var rec *recorder
			var approving time.Duration
			for i := 0; i < b.N; i++ {
				if id == "" || d == DecisionAllowAlways {
					id = h.newSession(alice, "guarded")
					rec = h.record(id)
				}
				ctx, cancel := context.WithCancel(context.Background())
				res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: `/tool echo {"text":"hi"}` + "\n/say after"})
				live := rec.until(UpdateApprovalRequest)
				reqID := live[len(live)-1].str("request_id")
				start := time.Now()
				resp, err := approveAs(h, id, reqID, d)
				approving += time.Since(start)
				if err != nil || !resp.GetAcknowledged() {
					b.Fatalf("approve: %v %v", resp, err)
				}
				rec.until(UpdateTurnComplete)
				if r := <-res; r.err != nil {
					b.Fatalf("prompt: %v", r.err)
				}
				cancel()
			}
			b.ReportMetric(float64(approving.Microseconds())/float64(b.N), "approve_us/op")
		})
	}
	b.Run("already_decided", func(b *testing.B) {
		// A decision sent again after its turn's end: answered from the
		// row (with the decision that stands, since the sixty-third
		// round); approve_us/op is that second Approve alone.
		id := h.newSession(alice, "guarded")
		rec := h.record(id)
		var again time.Duration
		for i := 0; i < b.N; i++ {
			res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: `/tool echo {"text":"hi"}`})
			live := rec.until(UpdateApprovalRequest)
			reqID := live[len(live)-1].str("request_id")
			if _, err := approveAs(h, id, reqID, DecisionReject); err != nil {
				b.Fatal(err)
			}
			rec.until(UpdateTurnComplete)
			if r := <-res; r.err != nil {
				b.Fatalf("prompt: %v", r.err)
			}
			start := time.Now()
			resp, err := approveAs(h, id, reqID, DecisionAllowOnce)
			again += time.Since(start)
			if err != nil || !resp.GetAlreadyDecided() {
				b.Fatalf("approve again: %v %v", resp, err)
			}
		}
		b.ReportMetric(float64(again.Microseconds())/float64(b.N), "approve_us/op")
	})
	b.Run("get_approval", func(b *testing.B) {
		// The read the durable bridge made after an already_decided
		// answer to learn which decision stood, and no longer makes
		// since the answer says it: GetApproval of an ask rejected in a
		// turn that ended (in process, without gRPC's round trip).
		id, rec, res, ask := askingTurn(b, h)
		reqID := ask.str("request_id")
		if _, err := approveAs(h, id, reqID, DecisionReject); err != nil {
			b.Fatal(err)
		}
		rec.until(UpdateTurnComplete)
		if r := <-res; r.err != nil {
			b.Fatalf("prompt: %v", r.err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			resp, err := h.srv.GetApproval(context.Background(), &sessionv1.GetApprovalRequest{Principal: alice, SessionId: id, RequestId: reqID})
			if err != nil || resp.GetApproval().GetDecision() != sessionv1.Decision_DECISION_REJECT {
				b.Fatalf("get approval: %v %v", resp, err)
			}
		}
	})
	b.Run("store", func(b *testing.B) {
		id := h.newSession(alice, "guarded")
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			reqID := ids.New("ap_")
			h.exec(`INSERT INTO approvals (request_id, session_id, turn_id, tool_call_id, tool_name, arguments_summary, timeout_secs)
				VALUES ($1, $2, 'turn_bench', 'call_bench', 'echo', '{}', 3600)`, reqID, id)
			b.StartTimer()
			if _, err := h.pool.Exec(context.Background(), `UPDATE approvals SET status = 'decided', decision = $2, surface = $3, replacement = $4, decided_at = now()
				WHERE request_id = $1 AND status = 'pending'`, reqID, DecisionAllowOnce, SurfaceRPC, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
}
