package e2e_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// kickWhile has the bus server drop the connection of the process named
// (its bus connection's name) every 10 ms until stop closes, and returns
// how many times it did.
func kickWhile(b *externalBus, name string, stop <-chan struct{}) <-chan int {
	kicked := make(chan int, 1)
	go func() {
		n := 0
		defer func() { kicked <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			conns, err := b.srv.Connz(&server.ConnzOptions{})
			if err != nil {
				continue
			}
			for _, ci := range conns.Conns {
				if ci.Name == name && b.srv.DisconnectClientByID(ci.Cid) == nil {
					n++
				}
			}
		}
	}()
	return kicked
}

// A connection prompts a session another connection follows, and the
// gateway's bus link is down when the turn is admitted: its
// turn_started, which tells the gateway that this connection's prompt
// was admitted, is lost, and nothing else is (the turn's first update
// comes later, once the link is back). Before, the prompting
// connection stayed muted: it saw none of its turn's updates, the other
// follower saw them all, and the prompt, its turn_complete never
// written, failed 5 s after the turn's end with both connections
// closed. The turn's first update now names the connection whose prompt
// started it: the prompting connection gets its whole turn.
func TestTurnStartLostOnTheBusStillReachesItsPrompter(t *testing.T) {
	t.Parallel()
	b := startOnExternalBus(t)
	other := b.s.Dial(t)
	other.Timeout = 60 * time.Second
	if _, err := other.Initialize(); err != nil {
		t.Fatal(err)
	}
	session, err := newSession(other)
	if err != nil {
		t.Fatal(err)
	}
	otherKinds := updateKinds{}
	onUpdates(other, otherKinds, make(chan struct{}, 1))

	c := b.s.Dial(t)
	c.Timeout = 60 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	kinds := updateKinds{}
	onUpdates(c, kinds, make(chan struct{}, 1))

	// The session service is held while the prompt is on its way: the
	// gateway, its bus link up, asks it to attach the connection and
	// waits.
	pid := b.s.PIDOf("session")
	if pid == 0 {
		t.Fatal("no session service")
	}
	resume := hang(t, pid)
	type answer struct {
		raw json.RawMessage
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		raw, err := c.Call("session/prompt", map[string]any{"session_id": session, "prompt": "/sleep 3000\n/say one two three"})
		answered <- answer{raw, err}
	}()
	time.Sleep(500 * time.Millisecond)

	// Now the gateway's bus link goes down and stays down while the
	// session service admits the turn, then comes back well before the
	// turn's first update.
	stop := make(chan struct{})
	kicked := kickWhile(b, "clawmesh-gateway", stop)
	time.Sleep(100 * time.Millisecond)
	resume()
	time.Sleep(700 * time.Millisecond)
	close(stop)
	t.Logf("the gateway's bus connection dropped %d times", <-kicked)

	var a answer
	select {
	case a = <-answered:
	case <-time.After(60 * time.Second):
		t.Fatal("the prompt was not answered")
	}
	if a.err != nil {
		t.Fatalf("the prompt: %v (its connection saw %v; the other follower %v)\ngateway log:\n%s", a.err, kinds, otherKinds, readLog(t, b.s, "gateway"))
	}
	if kinds["agent_message_chunk"] != 3 || kinds["turn_complete"] != 1 {
		t.Fatalf("the prompting connection saw %v of its turn (the other follower %v)", kinds, otherKinds)
	}
	// The other follower is still open and saw the turn whole.
	if _, err := other.Call("session/state", map[string]any{"session_id": session}); err != nil {
		t.Fatalf("the other follower after the turn: %v", err)
	}
	if otherKinds["agent_message_chunk"] != 3 || otherKinds["turn_complete"] != 1 {
		t.Fatalf("the other follower saw %v", otherKinds)
	}
}
