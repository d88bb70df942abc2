package gateway

import (
	"context"
	"fmt"
	"net"
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

// runHeld runs a gateway whose session service is h; h's calls all
// return once the test ends (before the gateway stops), so a failing test
// does not leave the gateway waiting for them.
func runHeld(t *testing.T) (*heldMessages, string) {
	h := &heldMessages{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	_, socket := runGateway(t, h, 30*time.Second)
	t.Cleanup(func() { close(h.release) })
	return h, socket
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
	h, socket := runHeld(t)
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

// One connection that pipelines large reads holds at most
// maxLargeReadsPerConn of the gateway's slots: another connection's read
// still reaches the service while the first one's others wait.
func TestLargeReadsOfOneConnectionLeaveTheOthersRoom(t *testing.T) {
	h, socket := runHeld(t)
	greedy, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer greedy.Close()
	frames := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocol_version":1}}` + "\n"
	for i := 1; i <= 12; i++ {
		frames += fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session/messages","params":{"session_id":"s1"}}`+"\n", i)
	}
	if _, err := greedy.Write([]byte(frames)); err != nil {
		t.Fatal(err)
	}
	for range maxLargeReadsPerConn {
		testwait.Recv(t, h.arrived)
	}
	select {
	case <-h.arrived:
		t.Fatalf("one connection ran more than %d large reads at once", maxLargeReadsPerConn)
	case <-time.After(300 * time.Millisecond):
	}
	other := dialInitialized(t, socket)
	defer other.Close()
	done := make(chan error, 1)
	go func() {
		_, err := other.Call("session/messages", map[string]any{"session_id": "s2"})
		done <- err
	}()
	testwait.Recv(t, h.arrived) // the other connection's read, at once
	for range 13 {
		h.release <- struct{}{}
	}
	if err := testwait.Recv(t, done); err != nil {
		t.Fatalf("the other connection's read: %v", err)
	}
}
