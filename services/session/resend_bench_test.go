package session

import (
	"context"
	"syscall"
	"testing"
	"time"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// BenchmarkResendRunningTurnWithAnAsk prices one Resend of a running
// turn from its start: text, a tool_call, its approval_request decided
// (allow_once, by session/approve) and the tool_result, then more text;
// the turn sleeps meanwhile. It is the path that reads the asks' decisions
// from memory (settledAsks) beside the stored ones; the rest of its cost
// is the database's (a checkpoint write and three reads).
func BenchmarkResendRunningTurnWithAnAsk(b *testing.B) {
	h := newHarness(b)
	guardEcho(h)
	id, rec, prev := sessionAfterATurn(h, "guarded")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: "/say one two three\n" + `/tool echo {"text":"hi"}` + "\n/say after\n/sleep 600000"})
	live := rec.until(UpdateApprovalRequest)
	if _, err := h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: live[len(live)-1].str("request_id"),
		Decision: decisionOf(DecisionAllowOnce), Surface: surfaceOf(SurfaceRPC)}); err != nil {
		b.Fatal(err)
	}
	rec.until(UpdateToolResult)
	for rec.next().Type != UpdateMessageChunk {
	}
	h.mapped(id)
	req := &sessionv1.ResendRequest{SessionId: id, Incarnation: h.incarnation(id), AfterSeq: prev}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	for b.Loop() {
		resp, err := h.srv.Resend(context.Background(), req)
		if err != nil || resp.GetLost() != "" || len(resp.GetUpdates()) < 4 {
			b.Fatalf("resend: %v, lost %q, %d updates", err, resp.GetLost(), len(resp.GetUpdates()))
		}
	}
	// The process's CPU (the service's side; PostgreSQL's is its own):
	// wall time at a loaded machine's is the scheduler's.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU is the user and system time this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
