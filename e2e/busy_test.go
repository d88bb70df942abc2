package e2e_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// A prompt refused SESSION_BUSY shows its connection nothing of the turn
// running on the session. The gateway follows the session for a prompt
// before the session service admits or refuses it; the running turn's
// chunks published in between reached the refused connection, pieces of
// another connection's turn with no start and no end.
func TestBusyPromptSeesNothingOfTheRunningTurn(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	owner := newConv(t, s, nil)
	id := owner.newSession("")
	var script strings.Builder
	for i := range 300 {
		fmt.Fprintf(&script, "/say chunk %d\n/sleep 5\n", i)
	}
	prompt := owner.send("session/prompt", map[string]any{"session_id": id, "prompt": script.String()})
	if u, ok := owner.upd(owner.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatalf("the turn's first frame %+v", u)
	}
	other := newConv(t, s, nil)
	var stray []update
	for range 40 {
		ups, f := other.until(other.send("session/prompt", map[string]any{"session_id": id, "prompt": "me too"}))
		if f.Error == nil || f.Error.Code != -32002 {
			t.Fatalf("a prompt during the turn: %s %v; want SESSION_BUSY", f.Result, f.Error)
		}
		stray = append(stray, ups...)
	}
	if _, f := owner.until(prompt); f.Error != nil {
		t.Fatal(f.Error)
	}
	if len(stray) > 0 {
		t.Fatalf("the connection refused SESSION_BUSY 40 times was sent %d of the running turn's updates, first %+v", len(stray), stray[0])
	}
}
