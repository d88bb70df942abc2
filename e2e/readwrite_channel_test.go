package e2e_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/e2e"
)

// startPluginsBehindBusProxy is startBehindBusProxy with plugins
// installed and args given to the stack.
func startPluginsBehindBusProxy(t *testing.T, plugins []string, args ...string) (*externalBus, *busProxy) {
	t.Helper()
	b, dir := newExternalBus(t, plugins)
	p := newBusProxy(t, fmt.Sprintf("127.0.0.1:%d", b.port))
	b.s = e2e.Start(t, e2e.Options{DataDir: dir, Args: args, Env: []string{"NATS_URL=" + p.url()}})
	return b, p
}

// A channel's message sent right after a config write that changed the
// channel's agent (its system prompt here): the channel's prompt carried
// no revision, and with the write's announcement late (held on the
// session service's bus link) the turn ran with the agent as it was
// before the write. The channel's prompt now asks the session service
// for the revision the config service serves (config_latest).
func TestChannelMessageSeesAConfigWriteJustMade(t *testing.T) {
	t.Parallel()
	b, px := startPluginsBehindBusProxy(t, []string{"webhook"},
		"--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stack's stderr:\n%s", b.s.Stderr())
		}
	})
	v := newConv(t, b.s, nil)
	v.call("config/set", map[string]any{"prop": "agents.default.system_prompt", "value": "prompt-before-the-write"})
	hookURL, replies := channelhook.Contents(t)
	bindWebChannel(t, v, hookURL)
	listen := webChannelListen(t, v, "")

	release := px.hold("clawmesh-session")
	defer release()
	v.call("config/set", map[string]any{"prop": "agents.default.system_prompt", "value": "prompt-of-the-set"})
	body, err := json.Marshal(map[string]string{"id": "m1", "from": "ann", "text": "/context", "thread": "t-1"})
	if err != nil {
		t.Fatal(err)
	}
	postWebMessage(t, listen, body)
	waitFor(t, "the reply on the webhook", 2*time.Minute, func() bool { return len(replies()) > 0 })
	reply := replies()[0]
	if got := contextSystem(reply); got != "prompt-of-the-set" {
		t.Fatalf("a channel's message right after a config/set: the turn's system prompt %q, want %q (the session service's bus link held)\n%s",
			got, "prompt-of-the-set", reply)
	}
}
