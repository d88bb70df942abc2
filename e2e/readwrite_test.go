package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A client's session/new right after its own config/set that adds the
// agent: the session service follows config revisions over the bus,
// and with the announcement late (here held on the session service's
// bus link) it refused the agent the client had just been told was
// set: "Unknown agent_alias". The gateway now passes on the revision
// the connection's last write returned, and the session service, behind
// it, reads up to that revision (bounded) before it answers. An alias
// no one set is still refused, at once.
func TestSessionNewSeesTheConnectionsOwnConfigWrite(t *testing.T) {
	t.Parallel()
	b, px := startBehindBusProxy(t)
	c := b.s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	release := px.hold("clawmesh-session")
	defer release()
	if _, err := c.Call("config/set", map[string]any{"prop": "agents.fresh.provider", "value": "scripted"}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := c.Call("session/new", map[string]any{"agent_alias": "fresh"}); err != nil {
		t.Fatalf("session/new right after the config/set that made its agent: %v", err)
	}
	t.Logf("session/new of the agent just set answered in %v, the session service's bus link held", time.Since(began).Round(time.Millisecond))

	// Another connection wrote nothing: an alias no one set is refused.
	o := b.s.Dial(t)
	if _, err := o.Initialize(); err != nil {
		t.Fatal(err)
	}
	_, err := o.Call("session/new", map[string]any{"agent_alias": "nobody"})
	if err == nil || !strings.Contains(err.Error(), "Unknown agent_alias") {
		t.Fatalf("session/new of an alias never set: %v, want Unknown agent_alias", err)
	}
	// Nor is the writer's own connection kept waiting for a revision
	// already read: an unknown alias is refused as before.
	_, err = c.Call("session/new", map[string]any{"agent_alias": "nobody"})
	if err == nil || !strings.Contains(err.Error(), "Unknown agent_alias") {
		t.Fatalf("session/new of an alias never set, on the writer's connection: %v, want Unknown agent_alias", err)
	}
}

// A client's session/prompt right after its own config/set that changes
// an agent the session service already knows (its system prompt here):
// only session/new carried the connection's revision, so the turn ran
// with the agent as of the revision the session service had followed,
// the announcement of the write held on its bus link: the client had
// been told its prompt was set, and its next turn did not use it. The
// prompt now carries the revision too, and the session service reads up
// to it before the turn resolves its agent.
func TestSessionPromptSeesTheConnectionsOwnConfigWrite(t *testing.T) {
	t.Parallel()
	b, px := startBehindBusProxy(t)
	c, session := tunedSession(t, b)
	// Each of the three writes: the prompt that follows it sees it.
	writes := []struct {
		method string
		params map[string]any
		want   string
	}{
		{"config/set", map[string]any{"prop": "agents.tuned.system_prompt", "value": "prompt-of-the-set"}, "prompt-of-the-set"},
		{"config/set-many", map[string]any{"sets": []any{map[string]any{"prop": "agents.tuned.system_prompt", "value": "prompt-of-the-set-many"}}}, "prompt-of-the-set-many"},
		{"config/delete", map[string]any{"prop": "agents.tuned.system_prompt"}, ""},
	}
	for i, w := range writes {
		release := px.hold("clawmesh-session")
		if _, err := c.Call(w.method, w.params); err != nil {
			t.Fatalf("%s: %v", w.method, err)
		}
		// The hold covers the write and the turn's start, where it
		// resolves its agent; the turn's first chunk (said once the
		// agent was resolved) lets it go, since the session service's
		// link held stalls its stream too (no answer to its flushes).
		id := fmt.Sprintf("prompt-%d", i)
		line, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "session/prompt",
			"params": map[string]any{"session_id": session, "prompt": "/context"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Send(string(line)); err != nil {
			t.Fatal(err)
		}
		var result json.RawMessage
		for result == nil {
			f, raw, err := c.Read(time.Minute)
			if err != nil {
				t.Fatalf("session/prompt after %s: %v (read %q)", w.method, err, raw)
			}
			switch {
			case string(f.ID) == `"`+id+`"` && f.Error != nil:
				t.Fatalf("session/prompt after %s: %v", w.method, f.Error)
			case string(f.ID) == `"`+id+`"`:
				result = f.Result
			case bytes.Contains(raw, []byte(`"agent_message_chunk"`)):
				release()
			}
		}
		release()
		var out struct {
			Content string `json:"content"`
		}
		if err := json.Unmarshal(result, &out); err != nil {
			t.Fatal(err)
		}
		if system := contextSystem(out.Content); system != w.want {
			t.Fatalf("session/prompt right after the connection's %s: the turn's system prompt %q, want %q (the session service's bus link held)\n%s",
				w.method, system, w.want, out.Content)
		}
	}
}
