package e2e_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// followedMidTurn starts a turn on session of b's stack that streams
// one chunk and then sleeps, from a connection of its own, and has f, a
// second connection, follow the session; it returns once f received
// the chunk.
func followedMidTurn(t *testing.T, b *externalBus) (f *e2e.Client, session string, kinds updateKinds) {
	t.Helper()
	c := b.s.Dial(t)
	c.Timeout = 120 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	session, err := newSession(c)
	if err != nil {
		t.Fatal(err)
	}
	f = b.s.Dial(t)
	f.Timeout = 120 * time.Second
	if _, err := f.Initialize(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Call("session/new", map[string]any{"session_id": session}); err != nil {
		t.Fatal(err)
	}
	kinds = updateKinds{}
	first := make(chan struct{}, 1)
	onUpdates(f, kinds, first)
	go func() {
		_, _ = c.Call("session/prompt", map[string]any{"session_id": session, "prompt": "/say before\n/sleep 60000\n/say after"})
	}()
	// f reads frames only inside a call: poll with a cheap one.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		if _, err := f.Call("session/state", map[string]any{"session_id": session}); err != nil {
			return err
		}
		if kinds["agent_message_chunk"] == 0 {
			return fmt.Errorf("no chunk yet: %v", kinds)
		}
		return nil
	})
	return f, session, kinds
}

// The session service is killed (SIGKILL) mid-turn: the connection
// following the session, which received every update published before
// the kill, gets the cut turn's turn_complete from the restarted
// service's recovery and stays. That recovering process is killed in
// turn before another turn ends, and the bus goes away and comes back:
// the gateway asks the third process for the session's last number, and
// it answers the recovered turn_complete's, stored by the recovery, which
// the follower received: the follower is kept and streams the next turn
// whole. Before, the recovery stored no number (published_seq stayed as
// the cut turn left it, unknown), the third process answered the bound
// the recovery had reserved (1,024 past the follower's number), and the
// gateway closed the follower, nothing lost.
func TestCrashOfARecoveryKeepsFollowers(t *testing.T) {
	t.Parallel()
	b := startOnExternalBus(t)
	f, session, kinds := followedMidTurn(t, b)
	first := b.s.PIDOf("session")
	if first == 0 {
		t.Fatal("no session service")
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		if _, err := f.Call("session/state", map[string]any{"session_id": session}); err != nil {
			return err
		}
		if kinds["turn_complete"] == 0 {
			return fmt.Errorf("no turn_complete yet: %v", kinds)
		}
		return nil
	})
	if kinds["agent_message_chunk"] != 1 || kinds["turn_complete"] != 1 {
		t.Fatalf("the follower received %v of the cut turn", kinds)
	}
	recovering := b.s.PIDOf("session")
	if recovering == 0 || recovering == first {
		t.Fatalf("session service not restarted (pid %d)", recovering)
	}

	b.shutdown()
	busLinkDownSeen(t, f)
	if err := syscall.Kill(recovering, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.start()
	wantFollowerKept(t, b, f, session, kinds, 60*time.Second)
}
