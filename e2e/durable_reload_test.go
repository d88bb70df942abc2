package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
)

// reloadScript thinks, speaks, calls a tool (an approval first), speaks
// and thinks again, calls another tool and speaks last: a turn with every
// kind of item a follower sees, which waits at each ask.
const reloadScript = "/think weighing it\n/say first part\n" + `/tool echo {"x":1}` +
	"\n/say middle\n/think again\n" + `/tool echo {"y":2}` + "\n/say last part"

// shown is a pane's items as Collie shows them: kind and text, in order
// (ids name a session's turn and tool calls, another in each session).
func shown(v collietest.PaneView) string {
	var b strings.Builder
	for _, it := range v.Items {
		fmt.Fprintf(&b, "%s: %q\n", it.Kind, it.Text)
	}
	return b.String()
}

// answerNext answers the pane's next open ask, allowing it.
func answerNext(t *testing.T, c *collietest.Client, pane string) {
	t.Helper()
	a := openAsk(t, c, pane)
	if r, err := c.Answer(context.Background(), pane, collietest.NewRequestID(), a, "allow_once"); err != nil || r.Status != http.StatusOK {
		t.Fatalf("answer: %v %v", r, err)
	}
	// Gone from the pane, or followed by the turn's next ask: a turn that
	// asks again at once (the script's second tool) can show its next ask
	// before any poll sees none open.
	pollUntil(t, c, "the ask answered", func(s *collietest.Snapshot) bool {
		p := s.Pane(pane)
		return p != nil && (len(p.Asks) == 0 || p.Asks[0].ID != a.ID)
	})
}

// A pane read again from what the session stored (the bridge restarted,
// so every reader takes the pane's whole view) shows what a follower that
// never left shows: the same items in the same order, the turn's thoughts
// among them, none twice. A pane rebuilt from the transcript lost its
// thinking item (thoughts are not transcript rows), and a turn running
// across the rebuild showed the text it had said before its tool call
// twice: once as the transcript's reply row, once in the reply its
// updates went on growing.
func TestDurablePaneReloadedAsFollowed(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: approvalArgs})
	c := phone(t, s)
	zc := newConv(t, s, nil)
	followed, reloaded := zc.newSession(""), zc.newSession("")
	pollUntil(t, c, "the panes", func(s *collietest.Snapshot) bool { return s.Pane(followed) != nil && s.Pane(reloaded) != nil })

	// The reference: a turn followed from its start to its end.
	wantReply(t, post(t, c, "/pane/"+followed+"/send", collietest.NewRequestID(), map[string]any{"text": reloadScript}), http.StatusOK, "")
	answerNext(t, c, followed)
	answerNext(t, c, followed)
	want := shown(eventsUntil(t, c, followed, "the followed turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "last part")
	}))
	if !strings.Contains(want, "\nthinking:") || strings.Count(want, "\nreply:") != 1 {
		t.Fatalf("the followed pane:\n%s", want)
	}

	// The same turn in another pane, the bridge killed while it waits at
	// its second ask: the new start rebuilds both panes.
	wantReply(t, post(t, c, "/pane/"+reloaded+"/send", collietest.NewRequestID(), map[string]any{"text": reloadScript}), http.StatusOK, "")
	answerNext(t, c, reloaded)
	eventsUntil(t, c, reloaded, "the turn at its second ask", func(v collietest.PaneView) bool {
		return v.State == "waiting" && strings.Contains(v.Text("reply"), "middle")
	})
	epoch := restartBridge(t, s, c)

	// A finished turn, read again.
	if got := shown(eventsUntil(t, c, followed, "the view of the new start", func(v collietest.PaneView) bool {
		return v.Epoch != epoch
	})); got != want {
		t.Errorf("finished turn read again:\n%s\nfollowed:\n%s", got, want)
	}
	// A running turn, read again and followed to its end.
	eventsUntil(t, c, reloaded, "the view of the new start", func(v collietest.PaneView) bool { return v.Epoch != epoch })
	answerNext(t, c, reloaded)
	got := shown(eventsUntil(t, c, reloaded, "the turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "last part")
	}))
	if got != want {
		t.Errorf("running turn read again and followed:\n%s\nfollowed:\n%s", got, want)
	}
}
