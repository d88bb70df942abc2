package pluginsandbox_test

import (
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// One reply endpoint that hangs holds its own replies only: the plugin ran
// every call of the channel on one instance, so while thread A's reply
// hung (here for as long as the test lasts: neither the call limit nor
// the HTTP timeout cuts it), thread B's reply and the polling of thread
// C's message waited for it, up to the call limit each time. Sends now
// run on instances of their own, one at a time per endpoint.
func TestChannelHungReplyEndpointHoldsNoOtherCall(t *testing.T) {
	hookURL, hung, replies, release := hungThreadAHook(t)
	fs := newFakeSessions()
	fs.answer = true

	lim := wasmhost.DefaultLimits()
	lim.CallTimeoutMS = uint64((10 * time.Minute).Milliseconds())
	ts := channelServerHost(t, fs, hookURL, func(c *wasmhost.Config) {
		c.Limits = lim
		c.HTTP.Timeout = 10 * time.Minute
	})
	t.Cleanup(release) // before the sandbox stops
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	postThread(t, web.Listen, "A", "a1")
	testwait.Recv(t, fs.prompts)
	if c := testwait.Recv(t, hung)["content"]; c != "re: a1" {
		t.Fatalf("hung reply %q, want a1's", c)
	}
	// A's reply hangs from here to the test's end.
	postThread(t, web.Listen, "B", "b1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "b1" {
		t.Fatalf("prompt %q, want b1 polled while a1's reply hangs", p.prompt)
	}
	if r := testwait.Recv(t, replies); r["content"] != "re: b1" || r["thread_id"] != "B" {
		t.Fatalf("reply %v, want b1's answer while a1's reply hangs", r)
	}
	postThread(t, web.Listen, "C", "c1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "c1" {
		t.Fatalf("prompt %q, want c1", p.prompt)
	}
	if r := testwait.Recv(t, replies); r["content"] != "re: c1" {
		t.Fatalf("reply %v, want c1's answer while a1's reply hangs", r)
	}
}
