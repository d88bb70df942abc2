package e2e_test

import (
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A phone reading a pane's events with its last cursor goes on from it
// across a restart of the session service between turns, stopped cleanly
// or killed: no reset, and the next turn's events follow the ones it had.
// Before, after a kill the session's view named its reserved sequence
// bound, a block past the last update published; the bridge took its
// pane for one that had lost updates, rebuilt it two reconciles later,
// and every reader took the pane's whole view again (a reset) though
// nothing was lost.
func TestDurableCursorKeptAcrossSessionRestart(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			s := e2e.Start(t, e2e.Options{})
			c := phone(t, s)
			id := paneOfNewSession(t, s, c)

			wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/think first thoughts\n/say first reply"}), http.StatusOK, "")
			before := eventsUntil(t, c, id, "the first turn's end", func(v collietest.PaneView) bool {
				return v.State == "idle" && strings.Contains(v.Text("reply"), "first reply")
			})

			pid := s.PIDOf("session")
			if pid == 0 {
				t.Fatal("no session service")
			}
			if err := syscall.Kill(pid, sig); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
				if now := s.PIDOf("session"); now == 0 || now == pid {
					return errors.New("the session service is not started again yet")
				}
				return nil
			})
			// A pane the bridge finds out of step is rebuilt at the second
			// reconcile (every 2 s) that finds it so: four pass here.
			deadline := time.Now().Add(8 * time.Second)
			for time.Now().Before(deadline) {
				if v := eventsUntil(t, c, id, "a read", func(collietest.PaneView) bool { return true }); v.Resets != before.Resets {
					t.Fatalf("the pane was reset after the session service's %s: %d whole views, %d before", sig, v.Resets, before.Resets)
				}
				time.Sleep(250 * time.Millisecond)
			}

			wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/think second thoughts\n/say second reply"}), http.StatusOK, "")
			after := eventsUntil(t, c, id, "the second turn's end", func(v collietest.PaneView) bool {
				return v.State == "idle" && strings.Contains(v.Text("reply"), "second reply")
			})
			if after.Resets != before.Resets {
				t.Fatalf("the pane was reset across the session service's %s: %d whole views, %d before", sig, after.Resets, before.Resets)
			}
			if got := shown(after); !strings.Contains(got, "first thoughts") || !strings.Contains(got, "first reply") || !strings.Contains(got, "second thoughts") {
				t.Fatalf("the pane followed across the %s:\n%s", sig, got)
			}
			if log := readLog(t, s, "durable-bridge"); strings.Contains(log, "pane out of step") || strings.Contains(log, "session updates lost on the bus") {
				t.Fatalf("the bridge took the pane for one that lost updates:\n%s", log)
			}
		})
	}
}

// A turn cut by a kill of the session service shows, to a phone reading
// the pane's events, as running until the recovery's end comes, then
// idle, with what the turn said before the cut once and the recovery's
// interruption notice: no reset (no session number is on the wire, and
// the pane's cursor goes on), and the next turn's events follow the ones
// the phone had. Before, the rows the recovery wrote were read at the
// turn's end while the service was not serving yet, and only at the next
// turn's start: the notice came with the next turn, and the text said
// before the cut twice (as the followed reply, and as the recovery's row).
func TestDurableTurnCutByACrashEndsWithoutAReset(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c := phone(t, s)
	id := paneOfNewSession(t, s, c)
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/say said before the cut\n/sleep 60000\n/say never said"}), http.StatusOK, "")
	before := eventsUntil(t, c, id, "the turn's first words", func(v collietest.PaneView) bool {
		return v.State == "running" && strings.Contains(v.Text("reply"), "before the cut")
	})
	pid := s.PIDOf("session")
	if pid == 0 {
		t.Fatal("no session service")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cut := eventsUntil(t, c, id, "the recovered turn's end and notice", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(shown(v), `notice: "[Turn interrupted`)
	})
	if cut.Resets != before.Resets {
		t.Errorf("the pane was reset by the recovery: %d whole views, %d before", cut.Resets, before.Resets)
	}
	if got := shown(cut); strings.Count(got, `reply: "said before the cut"`) != 1 || strings.Contains(cut.Text("reply"), "never said") {
		t.Errorf("the cut turn (its prompt, its reply once, its notice) when it ended:\n%s", got)
	}
	// Four reconciles (every 2 s) pass: a pane the bridge finds out of
	// step is rebuilt at the second.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if v := eventsUntil(t, c, id, "a read", func(collietest.PaneView) bool { return true }); v.Resets != before.Resets {
			t.Fatalf("the pane was reset after the recovery: %d whole views, %d before", v.Resets, before.Resets)
		}
		time.Sleep(250 * time.Millisecond)
	}
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/say the next turn"}), http.StatusOK, "")
	after := eventsUntil(t, c, id, "the next turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "the next turn")
	})
	if after.Resets != before.Resets {
		t.Errorf("the pane was reset across the crash: %d whole views, %d before", after.Resets, before.Resets)
	}
	if got := shown(after); strings.Count(got, `reply: "said before the cut"`) != 1 {
		t.Errorf("the cut turn's reply once, after the next turn:\n%s", got)
	}
	if log := readLog(t, s, "durable-bridge"); strings.Contains(log, "pane out of step") || strings.Contains(log, "session updates lost on the bus") {
		t.Errorf("the bridge took the pane for one that lost updates:\n%s", log)
	}
}
