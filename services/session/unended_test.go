package session

import (
	"context"
	"testing"
	"time"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A turn that completed while its end's write failed (its row locked past
// the unwind bound) published turn_complete completed, end_turn, with its
// reply. The next admission ended it as recovery ends a turn: cancelled,
// interrupted, its reply only what the checkpoint writer had stored
// before (nothing here: its batches wait an hour), so the store said
// otherwise than its clients were told, and session/load and the bridge's
// replay lacked its last chunks. It is now written as it ended.
func TestUnrecordedEndIsWrittenAsItEnded(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 500 * time.Millisecond
		c.CheckpointInterval = time.Hour
	})
	id := h.newSession(operator, "default")
	done := h.failEnd(UpdateMessageChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say first\n/sleep 1500\n/say last"}, false)
	if done.Params["outcome"] != OutcomeCompleted || done.Params["stop_reason"] != stopEndTurn || done.Params["content"] != "first\nlast" {
		t.Fatalf("the case: turn_complete %v, want completed, end_turn, its reply", done.Params)
	}
	turnID, _ := done.Params["turn_id"].(string)

	if r := h.prompt(operator, id, "/say next"); r.GetContent() != "next" {
		t.Fatalf("the next prompt: %v", r)
	}
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
}

// endedAsTold checks that turn turnID of session id is stored as its
// turn_complete said it ended: its outcome, stop reason and reply, the
// reply in its checkpoint events and in the transcript, and no
// interruption marker.
func (h *harness) endedAsTold(id, turnID, outcome, stop, reply string) {
	t := h.t
	t.Helper()
	var state, gotOutcome, gotStop, content string
	if err := h.pool.QueryRow(context.Background(), "SELECT state, outcome, stop_reason, content FROM turns WHERE turn_id = $1", turnID).
		Scan(&state, &gotOutcome, &gotStop, &content); err != nil {
		t.Fatal(err)
	}
	if state != turnDone || gotOutcome != outcome || gotStop != stop || content != reply {
		t.Errorf("the turn reads %s, %s, %s, %q; its clients were told %s, %s, %q", state, gotOutcome, gotStop, content, outcome, stop, reply)
	}
	var events string
	if err := h.pool.QueryRow(context.Background(), `SELECT COALESCE(string_agg(content, '' ORDER BY seq), '')
		FROM checkpoint_events WHERE turn_id = $1 AND kind = 'text'`, turnID).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != reply {
		t.Errorf("the turn's checkpoint events hold %q, want %q", events, reply)
	}
	want := 1
	if reply == "" {
		want = 0
	}
	if n := h.count("SELECT count(*) FROM messages WHERE turn_id = $1 AND role = 'assistant'", turnID); n != want {
		t.Errorf("%d transcript rows of the turn's reply, want %d", n, want)
	} else if n := h.count("SELECT count(*) FROM messages WHERE turn_id = $1 AND role = 'assistant' AND content = $2", turnID, reply); n != want {
		t.Errorf("the transcript's row of the turn's reply is not %q", reply)
	}
	if n := h.count("SELECT count(*) FROM messages WHERE session_id = $1 AND content = $2", id, interruptedMarker); n != 0 {
		t.Errorf("%d interruption markers in the transcript", n)
	}
	if n := h.count("SELECT count(*) FROM sessions WHERE session_id = $1 AND state = 'idle'", id); n != 1 {
		t.Error("the session's row does not read idle")
	}
}

// The same completed turn with an idempotency key: its message delivered
// again ran it again (resumed, as a cut turn is), where the turn had
// completed and its sender been told so. It is answered with the turn.
func TestKeyedPromptAfterAnUnrecordedCompletedEnd(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.UnwindTimeout = 500 * time.Millisecond })
	ctx := context.Background()
	id := h.channelSession("chan_unrecorded_done")
	const text = "/tool echo {\"pay\":7}\n/sleep 1500\n/say done"
	h.failEnd(UpdateToolResult, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, Prompt: text, IdempotencyKey: "msg-7"}, false)

	again, err := h.keyedPrompt(ctx, id, "msg-7", text)
	if err != nil || !again.GetReplayed() || again.GetOutcome() != outcomeEnum[OutcomeCompleted] || again.GetContent() != "done" {
		t.Fatalf("the delivery again: %v %v, want the completed turn replayed", again, err)
	}
	if n := h.echoRuns(id, `{"pay":7}`); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// A turn without a key whose end's write failed, its session then left
// idle until its in-memory half was evicted: nothing ended it before the
// service's next start, and its row and its session's read running to
// the session list and the bridge meanwhile. Eviction ends it now.
func TestEvictionEndsATurnWhoseEndWasNotRecorded(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 500 * time.Millisecond
		c.LiveIdleTimeout = time.Hour
	})
	id := h.newSession(operator, "default")
	done := h.failEnd(UpdateThoughtChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/think cut\n/sleep 2000\n/say never"}, true)
	turnID, _ := done.Params["turn_id"].(string)

	if n := h.srv.evictIdle(time.Now().Add(2 * time.Hour)); n != 1 {
		t.Fatalf("%d sessions evicted, want 1", n)
	}
	if n := h.count("SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'running'", id); n != 0 {
		t.Fatalf("%d turns still running in the store after the session's eviction", n)
	}
	h.endedAsTold(id, turnID, OutcomeCancelled, stopCancelled, "")
}

// While the store still refuses the end, eviction keeps the session in
// memory, and the end with it, for the next sweep.
func TestEvictionKeepsAnEndTheStoreRefuses(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 500 * time.Millisecond
		c.LiveIdleTimeout = time.Hour
	})
	ctx := context.Background()
	id := h.newSession(operator, "default")
	done := h.failEnd(UpdateThoughtChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/think cut\n/sleep 2000\n/say never"}, true)
	turnID, _ := done.Params["turn_id"].(string)

	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM turns WHERE turn_id = $1 FOR UPDATE", turnID); err != nil {
		t.Fatal(err)
	}
	if n := h.srv.evictIdle(time.Now().Add(2 * time.Hour)); n != 0 {
		t.Fatalf("%d sessions evicted while their turn's end could not be written, want 0", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.srv.evictIdle(time.Now().Add(2 * time.Hour)); n != 1 {
		t.Fatalf("%d sessions evicted at the next sweep, want 1", n)
	}
	h.endedAsTold(id, turnID, OutcomeCancelled, stopCancelled, "")
}

// A stop of the service before the session's next admission writes the
// end too; its start then finds nothing to recover, and publishes no
// second turn_complete. (A crash loses it: the next start ends the turn
// as recovery ends one, cancelled, interrupted, with the events stored.)
func TestShutdownWritesAnEndNotRecorded(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 500 * time.Millisecond
		c.CheckpointInterval = time.Hour
	})
	id := h.newSession(operator, "default")
	done := h.failEnd(UpdateMessageChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say first\n/sleep 1500\n/say last"}, false)
	turnID, _ := done.Params["turn_id"].(string)

	rec := h.record(id)
	h.restart()
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
	rec.quiet(200 * time.Millisecond)
}

// Past the bound on what the process keeps of ends not written, a turn's
// end is not kept: the next admission ends the turn as recovery ends
// one, and the bound's count is as it was.
func TestUnrecordedEndPastTheBoundIsRecovered(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 500 * time.Millisecond
		c.CheckpointInterval = time.Hour
	})
	id := h.newSession(operator, "default")
	h.srv.unendedBytes.Store(maxUnendedBytes)
	done := h.failEnd(UpdateMessageChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say first\n/sleep 1500\n/say last"}, false)
	turnID, _ := done.Params["turn_id"].(string)

	if r := h.prompt(operator, id, "/say next"); r.GetContent() != "next" {
		t.Fatalf("the next prompt: %v", r)
	}
	if n := h.count("SELECT count(*) FROM turns WHERE turn_id = $1 AND state = 'done' AND stop_reason = $2", turnID, stopInterrupted); n != 1 {
		t.Fatal("the turn not kept was not ended as recovery ends one")
	}
	if n := h.srv.unendedBytes.Load(); n != maxUnendedBytes {
		t.Fatalf("the bound's count is %d, want %d", n, maxUnendedBytes)
	}
}
