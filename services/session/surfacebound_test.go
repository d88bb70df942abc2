package session

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A surface's bound of open sessions (a channel alias's max_sessions)
// holds in the session service, whoever opens them: two sandbox replicas
// sharing a channel's listener each kept the bound over the conversations
// it had opened, twice the bound together. Past it the least recently
// active idle one is closed; a running one never is, and when every one
// runs the opening is refused as busy, for the channel to try again.
func TestSurfaceBoundHoldsForEveryOpener(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	const max = 8
	open := func(id, surface string) error {
		_, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: chanOperator, AgentAlias: "default",
			SessionId: id, InteractionSurface: surface, MaxOpenOfSurface: max})
		return err
	}
	openOf := func(surface string) int {
		return h.count("SELECT count(*) FROM sessions WHERE interaction_surface = $1 AND state IN ('idle', 'running')", surface)
	}
	for i := range 12 {
		if err := open(fmt.Sprintf("chan_a%d", i), "channel:web"); err != nil {
			t.Fatalf("conversation %d: %v", i, err)
		}
	}
	if err := open("chan_other", "channel:other"); err != nil {
		t.Fatal(err)
	}
	if n := openOf("channel:web"); n != max {
		t.Fatalf("%d sessions of channel:web open, want its bound %d", n, max)
	}
	if n := openOf("channel:other"); n != 1 {
		t.Fatalf("%d sessions of channel:other open, want 1", n)
	}
	if st := h.state(chanOperator, "chan_a0"); st != "closed" {
		t.Fatalf("the least recently active conversation is %s, want closed", st)
	}

	// Every open one runs a turn: none is closed, the opening waits.
	var cancels []context.CancelFunc
	t.Cleanup(func() {
		for _, c := range cancels {
			c()
		}
	})
	for i := 4; i < 12; i++ {
		id := fmt.Sprintf("chan_a%d", i)
		cctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		h.promptAsync(cctx, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, Prompt: "/sleep 30000"})
		eventually(t, func() error {
			if st := h.state(chanOperator, id); st != "running" {
				return fmt.Errorf("%s is %s", id, st)
			}
			return nil
		})
	}
	err := open("chan_a0", "channel:web")
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonSessionBusy, "channel:web")
	if n := openOf("channel:web"); n != max {
		t.Fatalf("%d sessions of channel:web open, want %d", n, max)
	}
	// One ends: the closed conversation reopens in its place.
	cancels[0]()
	eventually(t, func() error {
		if st := h.state(chanOperator, "chan_a4"); st != "idle" {
			return fmt.Errorf("chan_a4 is %s", st)
		}
		return nil
	})
	if err := open("chan_a0", "channel:web"); err != nil {
		t.Fatalf("reopening: %v", err)
	}
	if n := openOf("channel:web"); n != max {
		t.Fatalf("%d sessions of channel:web open, want %d", n, max)
	}
	if st := h.state(chanOperator, "chan_a4"); st != "closed" {
		t.Fatalf("the conversation whose turn ended is %s, want closed", st)
	}
}
