package e2e_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// tunedSession dials b's stack, sets the agent tuned (the scripted
// provider, its system prompt "prompt-before-the-write") and opens a
// session of it on that connection; a failed test logs the stack's
// stderr.
func tunedSession(t *testing.T, b *externalBus) (*e2e.Client, string) {
	t.Helper()
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
	return c, sess.SessionID
}

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
