package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// sessionState is the state session/state answers for session on c.
func sessionState(c *e2e.Client, session string) (string, error) {
	raw, err := c.Call("session/state", map[string]any{"session_id": session})
	if err != nil {
		return "", err
	}
	var st struct {
		State string `json:"state"`
	}
	return st.State, json.Unmarshal(raw, &st)
}

// onUpdateTexts has c count its updates by type into kinds and gather
// the text of its message chunks into text.
func onUpdateTexts(c *e2e.Client, kinds updateKinds, text *strings.Builder) {
	c.OnFrame = func(f *e2e.Frame, _ []byte) {
		if f.Method != "session/update" {
			return
		}
		var p struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(f.Params, &p)
		kinds[p.Type]++
		if p.Type == "agent_message_chunk" {
			text.WriteString(p.Text)
		}
	}
}

// wantStreamsNextTurn prompts session on c, which follows it, and wants
// the whole turn streamed to it.
func wantStreamsNextTurn(t *testing.T, b *externalBus, c *e2e.Client, session string, kinds updateKinds) {
	t.Helper()
	clear(kinds)
	if _, err := c.Call("session/prompt", map[string]any{"session_id": session, "prompt": "/say three four five"}); err != nil {
		t.Fatalf("the follower, after its missed updates were sent again: %v\ngateway log:\n%s", err, readLog(t, b.s, "gateway"))
	}
	if kinds["agent_message_chunk"] != 3 || kinds["turn_complete"] != 1 {
		t.Fatalf("the next turn streamed %v", kinds)
	}
}

// promptedTurn is a session followed after a first turn on a stack whose
// gateway reaches the bus through a proxy, then prompted from another
// connection: the follower's updates by type and its text (as
// onUpdateTexts fills them) and, once it comes, the prompt's answer.
type promptedTurn struct {
	b        *externalBus
	px       *busProxy
	f        *e2e.Client
	session  string
	kinds    updateKinds
	text     *strings.Builder
	prompted chan error
}

// promptFollowed starts that stack and sends prompt, whose connection
// waits up to timeout for its answer.
func promptFollowed(t *testing.T, prompt string, timeout time.Duration) *promptedTurn {
	t.Helper()
	pt := &promptedTurn{kinds: updateKinds{}, text: &strings.Builder{}, prompted: make(chan error, 1)}
	pt.b, pt.px = startBehindBusProxy(t)
	pt.f, pt.session, _ = followedAfterATurn(t, pt.b)
	onUpdateTexts(pt.f, pt.kinds, pt.text)
	p := pt.b.s.Dial(t)
	p.Timeout = timeout
	if _, err := p.Initialize(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := p.Call("session/prompt", map[string]any{"session_id": pt.session, "prompt": prompt})
		pt.prompted <- err
	}()
	return pt
}

// sessionBecomes waits until the session's state, as its follower f
// reads it, is want.
func sessionBecomes(t *testing.T, f *e2e.Client, session, want string, within, poll time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, poll, func() error {
		st, err := sessionState(f, session)
		if err == nil && st != want {
			err = fmt.Errorf("the session is %s", st)
		}
		return err
	})
}

// keptUntilTurnComplete waits for the follower f to have a turn_complete,
// and fails t at once, with the gateway's log, if f is closed meanwhile:
// the follower of what.
func keptUntilTurnComplete(t *testing.T, b *externalBus, f *e2e.Client, session string, kinds updateKinds, what string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if _, err := f.Call("session/state", map[string]any{"session_id": session}); err != nil {
			t.Fatalf("the follower of %s was closed: %v\ngateway log:\n%s", what, err, readLog(t, b.s, "gateway"))
		}
		if kinds["turn_complete"] == 0 {
			return fmt.Errorf("no turn_complete yet: %v", kinds)
		}
		return nil
	})
}

// A whole turn of a followed session runs while the gateway's bus link
// is down (another connection prompted it just before): its updates
// reach no follower. Once the link is back, the session service rebuilds
// the turn from what it stored (its checkpoint events, its end and the
// number its turn_complete took) and the gateway sends it to the
// follower, which is kept: it receives the turn's text and its
// turn_complete, and streams the next turn whole. Before, the gateway
// closed the follower (and the prompting connection) with nothing it
// could not have sent again.
func TestResendsATurnMissedWhileTheBusLinkWasDown(t *testing.T) {
	t.Parallel()
	b, f, session, kinds, text := missATurn(t, "/sleep 2000\n/say six seven")
	if kinds["turn_complete"] != 1 || text.String() != "six seven" {
		t.Fatalf("the follower received %v, text %q, of the turn it missed", kinds, text.String())
	}
	wantStreamsNextTurn(t, b, f, session, kinds)
}

// A missed turn that called a tool is sent again with its call and its
// result, each once, and the text on both sides of them (the turns the
// resend tests covered before said text alone).
func TestResendsAMissedTurnWithItsToolCall(t *testing.T) {
	t.Parallel()
	b, f, session, kinds, text := missATurn(t, "/sleep 2000\n/say before\n"+`/tool echo {"text":"hi"}`+"\n/say after")
	if kinds["tool_call"] != 1 || kinds["tool_result"] != 1 || kinds["turn_complete"] != 1 || text.String() != "before\nafter" {
		t.Fatalf("the follower received %v, text %q, of the turn it missed", kinds, text.String())
	}
	wantStreamsNextTurn(t, b, f, session, kinds)
}

// missATurn has a followed session run prompt (which should sleep first)
// while the gateway's bus link is down, then brings the link back and
// waits for the follower, which must be kept, to get the turn's
// turn_complete sent again; it returns the follower, its session, the
// updates it got by type and its message text.
func missATurn(t *testing.T, prompt string) (*externalBus, *e2e.Client, string, updateKinds, *strings.Builder) {
	t.Helper()
	pt := promptFollowed(t, prompt, 60*time.Second)
	b, f, session, kinds := pt.b, pt.f, pt.session, pt.kinds
	sessionBecomes(t, f, session, "running", 20*time.Second, 20*time.Millisecond)
	pt.px.block("clawmesh-gateway")
	busLinkDownSeen(t, f)
	sessionBecomes(t, f, session, "idle", 30*time.Second, 100*time.Millisecond)
	if kinds["agent_message_chunk"] != 0 || kinds["tool_call"] != 0 {
		t.Fatalf("the follower received %v with the gateway's bus link down", kinds)
	}
	pt.px.unblock()
	keptUntilTurnComplete(t, b, f, session, kinds, "a turn the session service could send again")
	if err := <-pt.prompted; err != nil {
		t.Fatalf("the prompt of the turn sent again: %v", err)
	}
	// The gateway logs the resend after it queued the updates, so the
	// follower may read them, and the prompt end, before the line is
	// written.
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !strings.Contains(readLog(t, b.s, "gateway"), "session updates missed were sent again") {
			return errors.New("the gateway did not say it sent the missed updates again")
		}
		return nil
	})
	return b, f, session, kinds, pt.text
}

// The session service is killed (SIGKILL) mid-turn while the gateway's
// bus link is down: the restarted service's recovery publishes the cut
// turn's turn_complete, which the follower (which had the turn's first
// chunk) misses. Once the link is back, that turn_complete, stored with
// its number by the recovery, is sent again: the follower is kept, as
// one whose gateway stayed on the bus is. Before, it was closed.
func TestResendsTheRecoveredTurnCompleteMissedWhileTheBusLinkWasDown(t *testing.T) {
	t.Parallel()
	b, px := startBehindBusProxy(t)
	f, session, kinds := followedMidTurn(t, b)
	first := b.s.PIDOf("session")
	if first == 0 {
		t.Fatal("no session service")
	}
	px.block("clawmesh-gateway")
	busLinkDownSeen(t, f)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		if pid := b.s.PIDOf("session"); pid == 0 || pid == first {
			return fmt.Errorf("session service not restarted (pid %d)", pid)
		}
		st, err := sessionState(f, session)
		if err == nil && st != "idle" {
			err = fmt.Errorf("the session is %s", st)
		}
		return err
	})
	if kinds["turn_complete"] != 0 {
		t.Fatalf("the follower received %v with the gateway's bus link down", kinds)
	}
	px.unblock()
	keptUntilTurnComplete(t, b, f, session, kinds, "a recovered turn")
	if kinds["agent_message_chunk"] != 1 || kinds["turn_complete"] != 1 {
		t.Fatalf("the follower received %v of the cut turn", kinds)
	}
	wantStreamsNextTurn(t, b, f, session, kinds)
}

// The gateway's bus link goes down in the middle of a turn, after the
// follower received its first text ("one two"); the turn ends meanwhile.
// Once the link is back, the session service sends the updates numbered
// past the follower's last (the rest of the text, the turn_complete),
// cut from the turn's stored events where its end recorded each update:
// the follower is kept, its text whole and said once, and streams the
// next turn whole. Before, the service answered "missed mid-turn: their
// numbers are not stored" and the gateway closed the follower (broken
// pipe), with 2 chunks of the turn.
func TestResendsTheMiddleOfATurnMissedWhileTheBusLinkWasDown(t *testing.T) {
	t.Parallel()
	pt := promptFollowed(t, "/say one two\n/sleep 3000\n/say three four", 60*time.Second)
	b, f, session, kinds, text := pt.b, pt.f, pt.session, pt.kinds, pt.text
	followerHasOneTwo(t, f, session, kinds, text)
	pt.px.block("clawmesh-gateway")
	busLinkDownSeen(t, f)
	sessionBecomes(t, f, session, "idle", 30*time.Second, 100*time.Millisecond)
	pt.px.unblock()
	keptUntilTurnComplete(t, b, f, session, kinds, "a turn whose middle it missed")
	if err := <-pt.prompted; err != nil {
		t.Fatalf("the prompt of the turn sent again: %v", err)
	}
	if kinds["turn_complete"] != 1 || text.String() != "one two\nthree four" {
		t.Fatalf("the follower received %v, text %q", kinds, text.String())
	}
	wantStreamsNextTurn(t, b, f, session, kinds)
}

// The gateway's bus link goes down in the middle of a turn, after the
// follower received its first text ("one two"), and comes back while
// the turn still runs (its tool's result is in the transcript, its last
// word a sleep away). The session service sends the updates the
// follower missed from the running turn's map, with their numbers: the
// follower is kept, gets the rest of the turn live, its text whole and
// said once, and streams the next turn whole. Before, the service
// answered that no ended turn held them, and the gateway closed the
// follower.
func TestResendsTheMiddleOfARunningTurnMissedWhileTheBusLinkWasDown(t *testing.T) {
	t.Parallel()
	pt := promptFollowed(t, "/say one two\n/sleep 2000\n/say three\n"+`/tool echo {"text":"hi"}`+"\n/sleep 20000\n/say four", 90*time.Second)
	b, px, f, session, kinds, text := pt.b, pt.px, pt.f, pt.session, pt.kinds, pt.text
	followerHasOneTwo(t, f, session, kinds, text)
	px.block("clawmesh-gateway")
	busLinkDownSeen(t, f)
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		raw, err := f.Call("session/messages", map[string]any{"session_id": session, "limit": 100})
		if err == nil && !strings.Contains(string(raw), "echo: ") {
			err = fmt.Errorf("no tool result in the transcript yet")
		}
		return err
	})
	if kinds["tool_call"] != 0 {
		t.Fatalf("the follower received %v with the link down", kinds)
	}
	px.unblock()
	follow := func(done func() error) func() error {
		return func() error {
			if _, err := f.Call("session/state", map[string]any{"session_id": session}); err != nil {
				t.Fatalf("the follower of a running turn whose middle it missed was closed: %v\ngateway log:\n%s", err, readLog(t, b.s, "gateway"))
			}
			return done()
		}
	}
	// The missed tool updates come while the turn still sleeps.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, follow(func() error {
		switch {
		case kinds["turn_complete"] != 0:
			t.Fatalf("the turn ended before the follower had the updates it missed: %v", kinds)
		case kinds["tool_result"] == 0:
			return fmt.Errorf("the follower has %v", kinds)
		}
		return nil
	}))
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, follow(func() error {
		if kinds["turn_complete"] == 0 {
			return fmt.Errorf("no turn_complete yet: %v", kinds)
		}
		return nil
	}))
	if err := <-pt.prompted; err != nil {
		t.Fatalf("the prompt of the turn: %v", err)
	}
	if kinds["turn_complete"] != 1 || kinds["tool_call"] != 1 || kinds["tool_result"] != 1 || text.String() != "one two\nthree\nfour" {
		t.Fatalf("the follower received %v, text %q", kinds, text.String())
	}
	wantStreamsNextTurn(t, b, f, session, kinds)
}

// followerHasOneTwo waits until the follower f of session has the turn's
// first two chunks, "one two" (kinds and text as onUpdateTexts fills
// them), and fails t if it has other text.
func followerHasOneTwo(t *testing.T, f *e2e.Client, session string, kinds updateKinds, text *strings.Builder) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if _, err := f.Call("session/state", map[string]any{"session_id": session}); err != nil {
			return err
		}
		if kinds["agent_message_chunk"] < 2 {
			return fmt.Errorf("the follower has %v", kinds)
		}
		return nil
	})
	if text.String() != "one two" {
		t.Fatalf("the follower had %q before the link went down", text.String())
	}
}
