package e2e_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/collietest"
)

// A text sent from a durable pane right after a config write that
// changed the pane's agent (its system prompt here): the bridge's
// StartTurn carried no revision, and with the write's announcement late
// (held on the session service's bus link) the turn ran with the agent
// as it was before the write, though config/set had answered. The
// session service now reads the config service's revision as of the
// turn's arrival before a bridge turn resolves its agent.
func TestDurableSendSeesAConfigWriteJustMade(t *testing.T) {
	t.Parallel()
	b, px := startBehindBusProxy(t)
	c, id := tunedSession(t, b)
	ph := phone(t, b.s)
	pollUntil(t, ph, "the session's pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })

	release := px.hold("clawmesh-session")
	if _, err := c.Call("config/set", map[string]any{"prop": "agents.tuned.system_prompt", "value": "prompt-of-the-set"}); err != nil {
		t.Fatal(err)
	}
	r := post(t, ph, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/context"})
	if r.Status != http.StatusOK {
		t.Fatalf("send: %s", r)
	}
	// The hold covers the write and the turn's start, where it resolves
	// its agent; the reply's first text (said once the agent was
	// resolved) lets it go, since the held link stalls the session
	// service's flushes too.
	v := eventsUntil(t, ph, id, "the turn's reply", func(v collietest.PaneView) bool {
		if v.Text("reply") != "" {
			release()
		}
		return v.State == "idle" && strings.Contains(v.Text("reply"), `"role"`)
	})
	if got := contextSystem(v.Text("reply")); got != "prompt-of-the-set" {
		t.Fatalf("a durable send right after a config/set: the turn's system prompt %q, want %q (the session service's bus link held)\n%s",
			got, "prompt-of-the-set", v.Text("reply"))
	}
}
