package session

import (
	"context"
	"testing"

	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A turn's start is announced before any update of it, naming the
// connection whose prompt started it, with no seq of its own: the
// gateway sends a connection that follows the session only for its
// prompt nothing before it. The first update with a seq is still the
// publisher's renumbered first, though the announcement went out
// before it. A turn no connection started names none.
func TestTurnStartAnnouncedFirst(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	for turn, conn := range []string{"c1", ""} {
		if _, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say hi", ConnectionId: conn}); err != nil {
			t.Fatal(err)
		}
		start := rec.nextOnBus()
		if start.GetType() != busv1.UpdateType_UPDATE_TYPE_TURN_STARTED || start.GetConnectionId() != conn || start.GetSeq() != 0 || start.GetJson() != "" {
			t.Fatalf("turn %d: the session's first message %v, want the turn's start naming %q", turn, start, conn)
		}
		first := rec.nextOnBus()
		if first.GetType() != busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK || first.GetRenumbered() != (turn == 0) {
			t.Fatalf("turn %d: the turn's first update %v", turn, first)
		}
		rec.until(UpdateTurnComplete)
	}
}
