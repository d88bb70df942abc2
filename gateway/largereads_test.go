package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// heldMessages holds every Messages call until the test releases one.
type heldMessages struct {
	sessionv1.UnimplementedSessionServiceServer
	arrived chan struct{}
	release chan struct{}
}

func (h *heldMessages) Messages(ctx context.Context, req *sessionv1.MessagesRequest) (*sessionv1.MessagesResponse, error) {
	h.arrived <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &sessionv1.MessagesResponse{SessionId: req.GetSessionId()}, nil
}

func (h *heldMessages) ConnectionClosed(context.Context, *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	return &sessionv1.ConnectionClosedResponse{}, nil
}

// Calls whose replies may be megabytes run maxLargeReads at a time,
// gateway-wide: the replies in the making are bounded, not only the ones
// queued (the requests in flight, 64 a connection, let twelve clients
// that read nothing take the gateway 2 GiB on a loaded machine). The
// rest wait for a slot and are served as slots come back.
func TestLargeReadsRunAFewAtATime(t *testing.T) {
	h := &heldMessages{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	_, socket := runGateway(t, h, 30*time.Second)
	const calls = maxLargeReads + 4
	done := make(chan error, calls)
	for range calls {
		c := dialInitialized(t, socket)
		t.Cleanup(func() { c.Close() })
		go func() {
			_, err := c.Call("session/messages", map[string]any{"session_id": "s1", "limit": 10})
			done <- err
		}()
	}
	for range maxLargeReads {
		testwait.Recv(t, h.arrived)
	}
	select {
	case <-h.arrived:
		t.Fatalf("more than %d large reads ran at once", maxLargeReads)
	case <-time.After(300 * time.Millisecond):
	}
	for i := range calls {
		h.release <- struct{}{}
		if i+maxLargeReads < calls {
			testwait.Recv(t, h.arrived) // a waiting call took the slot
		}
	}
	for range calls {
		if err := testwait.Recv(t, done); err != nil {
			t.Fatalf("a large read: %v", err)
		}
	}
}
