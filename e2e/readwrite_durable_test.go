package e2e_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/collietest"
)

// contextSystem is the system message of a /context turn's reply.
func contextSystem(reply string) string {
	system := ""
	for _, line := range strings.Split(reply, "\n") {
		var m struct{ Role, Content string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Role == "system" {
			system = m.Content
		}
	}
	return system
}

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
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stack's stderr:\n%s", b.s.Stderr())
		}
	})
	c := b.s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call("config/set-many", map[string]any{"sets": []any{
		map[string]any{"prop": "agents.tuned.provider", "value": "scripted"},
		map[string]any{"prop": "agents.tuned.system_prompt", "value": "prompt-before-the-write"},
	}}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Call("session/new", map[string]any{"agent_alias": "tuned"})
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(res, &sess); err != nil {
		t.Fatal(err)
	}
	ph := phone(t, b.s)
	id := sess.SessionID
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
