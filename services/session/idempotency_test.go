package session

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// chanOperator is who a channel prompts as (the sandbox's
// channelPrincipal).
var chanOperator = &commonv1.Principal{PrincipalId: configschema.OperatorPrincipal, Operator: true}

// channelSession opens a session of a channel's surface, whose
// interrupted turns recovery leaves to that surface.
func (h *harness) channelSession(id string) string {
	h.t.Helper()
	resp, err := h.srv.NewSession(context.Background(), &sessionv1.NewSessionRequest{
		Principal: chanOperator, AgentAlias: "default", SessionId: id, InteractionSurface: "channel:web"})
	if err != nil {
		h.t.Fatalf("new session: %v", err)
	}
	return resp.GetSessionId()
}

// keyedPrompt runs a prompt with an idempotency key.
func (h *harness) keyedPrompt(ctx context.Context, id, key, text string) (*sessionv1.PromptResponse, error) {
	return h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, Prompt: text, IdempotencyKey: key})
}

// echoRuns counts the echo calls of a session whose arguments are args.
func (h *harness) echoRuns(id, args string) int {
	return h.count("SELECT count(*) FROM tool_calls WHERE session_id = $1 AND name = 'echo' AND raw_input = $2::jsonb AND status = 'completed'", id, args)
}

// A message delivered twice (a channel's, after a rebind or a restart cut
// its delivery) is one turn: with its idempotency key, a finished turn is
// answered again without running, and a cut one is resumed, its tool not
// run a second time. Without the key's check, each delivery ran the
// message as a new turn, and a side-effecting tool acted twice.
func TestKeyedPromptRunsNoToolTwice(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()

	t.Run("finished", func(t *testing.T) {
		id := h.channelSession("chan_finished")
		const text = "/tool echo {\"pay\":1}\n/say paid"
		first, err := h.keyedPrompt(ctx, id, "msg-1", text)
		if err != nil || first.GetContent() != "paid" || first.GetReplayed() {
			t.Fatalf("first delivery: %v %v", first, err)
		}
		again, err := h.keyedPrompt(ctx, id, "msg-1", text)
		if err != nil || again.GetContent() != "paid" || !again.GetReplayed() || again.GetTurnId() != first.GetTurnId() ||
			again.GetOutcome() != outcomeEnum[OutcomeCompleted] {
			t.Fatalf("second delivery: %v %v", again, err)
		}
		if n := h.echoRuns(id, `{"pay":1}`); n != 1 {
			t.Fatalf("the tool ran %d times", n)
		}
		if n := h.count("SELECT count(*) FROM messages WHERE session_id = $1 AND role = 'user'", id); n != 1 {
			t.Fatalf("%d prompts in the transcript", n)
		}
		// Another message (another key) is a turn of its own.
		if r, err := h.keyedPrompt(ctx, id, "msg-2", text); err != nil || r.GetReplayed() {
			t.Fatalf("another message: %v %v", r, err)
		}
		if n := h.echoRuns(id, `{"pay":1}`); n != 2 {
			t.Fatalf("the tool ran %d times for two messages", n)
		}
	})

	t.Run("cut", func(t *testing.T) {
		id := h.channelSession("chan_cut")
		rec := h.record(id)
		// The resumed turn reads the prompt the cut one stored: the
		// same message, sleep and all.
		const text = "/tool echo {\"pay\":2}\n/sleep 2000\n/say resumed"
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := h.srv.Prompt(cctx, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, Prompt: text, IdempotencyKey: "msg-3"})
			done <- err
		}()
		rec.until(UpdateToolResult)
		cancel() // the delivery is cut: its caller gone
		rec.until(UpdateTurnComplete)
		testwait.Recv(t, done)
		again, err := h.keyedPrompt(ctx, id, "msg-3", text)
		if err != nil || again.GetReplayed() || again.GetOutcome() != outcomeEnum[OutcomeCompleted] || again.GetContent() != "resumed" {
			t.Fatalf("the delivery again: %v %v", again, err)
		}
		if n := h.echoRuns(id, `{"pay":2}`); n != 1 {
			t.Fatalf("the tool ran %d times", n)
		}
		if n := h.count("SELECT count(*) FROM messages WHERE session_id = $1 AND role = 'user'", id); n != 1 {
			t.Fatalf("%d prompts in the transcript", n)
		}
	})

	t.Run("interrupted", func(t *testing.T) {
		id := h.channelSession("chan_interrupted")
		rec := h.record(id)
		h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, IdempotencyKey: "msg-4",
			Prompt: "/tool echo {\"pay\":4}\n/sleep 2000\n/say after the restart"})
		rec.until(UpdateToolResult)
		h.crash()
		again, err := h.keyedPrompt(ctx, id, "msg-4", "/tool echo {\"pay\":4}\n/sleep 2000\n/say after the restart")
		if err != nil || again.GetReplayed() || again.GetOutcome() != outcomeEnum[OutcomeCompleted] || again.GetContent() != "after the restart" {
			t.Fatalf("the delivery again: %v %v", again, err)
		}
		if n := h.echoRuns(id, `{"pay":4}`); n != 1 {
			t.Fatalf("the tool ran %d times", n)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		id := h.channelSession("chan_invalid")
		_, err := h.keyedPrompt(ctx, id, "no spaces", "/say hi")
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "idempotency_key")
	})
}

// A turn whose end the store did not take in time (its write past the
// unwind bound, the database slow or its row locked) stayed running in
// the store, where this process had ended it: its session ran other
// turns, but its message delivered again (a channel's, after the replica
// that sent it died) was refused busy at every try, "left running by a
// process whose recovery has not ended it", until the service's next
// start. The channel retried it for five minutes, then told its sender
// it could not be answered. One process owns every turn: a running row
// without the session's live turn is ended as recovery ends one, and
// the message resumes it.
func TestKeyedPromptAfterAnUnrecordedEnd(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = 500 * time.Millisecond })
	ctx := context.Background()
	id := h.channelSession("chan_unrecorded")
	const text = "/tool echo {\"pay\":5}\n/sleep 2000\n/say resumed"
	h.endUnrecorded(UpdateToolResult, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, Prompt: text, IdempotencyKey: "msg-5"})

	again, err := h.keyedPrompt(ctx, id, "msg-5", text)
	if err != nil || again.GetReplayed() || again.GetOutcome() != outcomeEnum[OutcomeCompleted] || again.GetContent() != "resumed" {
		t.Fatalf("the delivery again: %v %v", again, err)
	}
	if n := h.echoRuns(id, `{"pay":5}`); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
	if n := h.count("SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'running'", id); n != 0 {
		t.Fatalf("%d turns still running", n)
	}
}

// The same failed end, then a prompt of another message (no key): the
// session ran it, but the cut turn stayed running in the store, and the
// session's row read running, as long as the process lived; the next
// start's recovery then published a second turn_complete for it. The
// next admission now ends it first.
func TestPromptEndsATurnWhoseEndWasNotRecorded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = 500 * time.Millisecond })
	id := h.newSession(operator, "default")
	h.endUnrecorded(UpdateThoughtChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/think cut\n/sleep 2000\n/say never"})

	if r := h.prompt(operator, id, "/say next"); r.GetContent() != "next" {
		t.Fatalf("the next prompt: %v", r)
	}
	if n := h.count("SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'running'", id); n != 0 {
		t.Fatalf("%d turns still running in the store after the next turn", n)
	}
	if n := h.count("SELECT count(*) FROM sessions WHERE session_id = $1 AND state = 'idle'", id); n != 1 {
		t.Fatal("the session's row does not read idle after the next turn")
	}
}

// endUnrecorded runs req and, once its update of type after came, cuts it
// (its caller gone) while the turn's row is locked past the unwind bound, so that its end's write fails, and
// checks the case: the turn left running in the store, its turn_complete
// published.
func (h *harness) endUnrecorded(after string, req *sessionv1.PromptRequest) {
	h.t.Helper()
	h.failEnd(after, req, true)
}

// failEnd is endUnrecorded, the turn cut (cut) or left to end on its own;
// it returns the turn_complete its followers were sent.
func (h *harness) failEnd(after string, req *sessionv1.PromptRequest, cut bool) update {
	t := h.t
	t.Helper()
	ctx := context.Background()
	id := req.GetSessionId()
	rec := h.record(id)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := h.promptAsync(cctx, req)
	rec.until(after)

	release := h.lockTurns("session_id", id)
	if cut {
		cancel()
	}
	ups := rec.until(UpdateTurnComplete)
	testwait.Recv(t, first)
	release()
	if n := h.count("SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'running'", id); n != 1 {
		t.Fatalf("%d turns left running by the failed end, want the case: 1", n)
	}
	return ups[len(ups)-1]
}
