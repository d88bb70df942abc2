package e2e_test

import (
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
