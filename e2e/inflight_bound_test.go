package e2e_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A connection at its in-flight bound (rpc.max_inflight_requests, 1
// here: a prompt waiting on its turn fills it) read nothing until one of
// its requests ended. A session/cancel sent then, the one request that
// could end the prompt, was never read: the turn ran its whole minute.
// And a client that hung up there was not seen gone: its turn ran on for
// a client no longer there. Through the real binaries both now end the
// turn at once (the gateway's package tests hold the mechanism).
func TestCancelAndHangUpSeenAtTheInflightBound(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", "rpc.max_inflight_requests=1"}})
	v := newConv(t, s, nil)
	const long = "/say start\n/sleep 60000\n/say never"

	id := v.newSession("")
	prompt := v.send("session/prompt", map[string]any{"session_id": id, "prompt": long})
	if u, ok := v.upd(v.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("turn did not start")
	}
	// At the bound now: the cancel comes on the same connection. Each
	// read waits at most 30 s, half the turn's sleep.
	cancel := v.send("session/cancel", map[string]any{"session_id": id})
	outcome := ""
	answered := map[string]bool{}
	for !answered[prompt] || !answered[cancel] {
		f := v.next()
		if u, ok := v.upd(f); ok {
			if u.Type == "turn_complete" {
				outcome = u.Outcome
			}
			continue
		}
		if f.Method != "" {
			continue
		}
		if f.Error != nil {
			t.Fatalf("request %s: %v", f.ID, f.Error)
		}
		answered[string(f.ID)] = true
	}
	if outcome != "cancelled" {
		t.Fatalf("the turn cancelled at the bound ended %q", outcome)
	}

	// A client that hangs up at its bound: its turn is cancelled.
	id2 := v.newSession("")
	w := newConv(t, s, nil)
	w.send("session/prompt", map[string]any{"session_id": id2, "prompt": long})
	if u, ok := w.upd(w.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("the second turn did not start")
	}
	w.c.Close()
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		var st struct{ State string }
		if err := json.Unmarshal(v.call("session/state", map[string]any{"session_id": id2}), &st); err != nil {
			return err
		}
		if st.State != "idle" {
			return fmt.Errorf("the turn of a client that hung up at its bound is still %s", st.State)
		}
		return nil
	})
}
