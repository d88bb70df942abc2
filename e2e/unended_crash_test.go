package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A turn completed while its end's write failed (its row locked past the
// session service's unwind bound), its clients told so; then the session
// service is killed (SIGKILL) before anything wrote that end. The next
// start recorded the turn as recovery records one (cancelled,
// interrupted, its last chunk missing) and published a second
// turn_complete saying so. It is written as it ended, and nobody is told
// a second end.
func TestTurnEndNotWrittenOutlivesASessionServiceKill(t *testing.T) {
	t.Parallel()
	s, _, db := durableStack(t)
	v := newConv(t, s, nil)
	id := v.newSession("")
	const prompt = "/say first\n/sleep 1500\n/say last"
	promptID := v.send("session/prompt", map[string]any{"session_id": id, "prompt": prompt})
	for {
		if u, ok := v.upd(v.next()); ok && u.Type == "agent_message_chunk" {
			break
		}
	}
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM session.turns WHERE session_id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	var turnID string
	for answered := false; !answered || turnID == ""; {
		f := v.next()
		if u, ok := v.upd(f); ok {
			if u.Type == "turn_complete" {
				if u.Outcome != "completed" || u.Content != "first\nlast" {
					t.Fatalf("the case: turn_complete %+v, want completed with its reply", u)
				}
				turnID = turnIDOf(t, f.Params)
			}
			continue
		}
		if string(f.ID) == promptID {
			answered = true
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := db.QueryRow(ctx, "SELECT state FROM session.turns WHERE turn_id = $1", turnID).Scan(&state); err != nil || state != "running" {
		t.Fatalf("the case: the turn reads %q (%v) after its end's write failed, want running", state, err)
	}

	pid := s.PIDOf("session")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var second []update
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		if p := s.PIDOf("session"); p == 0 || p == pid {
			return fmt.Errorf("session service pid %d (killed %d)", p, pid)
		}
		ups, f := v.until(v.send("session/state", map[string]any{"session_id": id}))
		for _, u := range ups {
			if u.Type == "turn_complete" {
				second = append(second, u)
			}
		}
		if f.Error != nil {
			return fmt.Errorf("session/state: %s", f.Error.Message)
		}
		return nil
	})

	if len(second) > 0 {
		t.Errorf("the restart told the session's clients a second end: %+v", second)
	}
	var outcome, stop, content string
	if err := db.QueryRow(ctx, "SELECT state, outcome, stop_reason, content FROM session.turns WHERE turn_id = $1", turnID).
		Scan(&state, &outcome, &stop, &content); err != nil {
		t.Fatal(err)
	}
	if state != "done" || outcome != "completed" || stop != "end_turn" || content != "first\nlast" {
		t.Errorf("after the restart the turn reads %s, %s, %s, %q; its clients were told completed, end_turn, %q",
			state, outcome, stop, content, "first\nlast")
	}
	rows := v.transcript(id)
	if len(rows) != 2 || rows[1].Role != "assistant" || rows[1].Content != "first\nlast" {
		t.Errorf("the transcript after the restart: %+v, want the prompt and the reply %q", rows, "first\nlast")
	}

	// A turn after it: its turn_complete comes after anything the
	// restart published on the session's subject.
	nextID := v.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say next"})
	for answered, nextDone := false, false; !answered || !nextDone; {
		f := v.next()
		if u, ok := v.upd(f); ok {
			if u.Type != "turn_complete" {
				continue
			}
			if got := turnIDOf(t, f.Params); got == turnID {
				t.Fatalf("a second turn_complete for the turn after the restart: %+v", u)
			}
			if u.Content != "next" {
				t.Fatalf("the next turn's turn_complete: %+v", u)
			}
			nextDone = true
			continue
		}
		if string(f.ID) == nextID {
			answered = true
		}
	}
}

// turnIDOf is the turn_id of a session/update's params.
func turnIDOf(t *testing.T, params json.RawMessage) string {
	t.Helper()
	var p struct {
		TurnID string `json:"turn_id"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		t.Fatalf("bad update %s: %v", params, err)
	}
	return p.TurnID
}
