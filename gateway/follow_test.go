package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// openClose makes a new session at every session/new and closes or kills
// whichever is named, as the session service does for the session's
// owner (ownership is not this test's).
type openClose struct {
	sessionv1.UnimplementedSessionServiceServer
}

func (openClose) NewSession(context.Context, *sessionv1.NewSessionRequest) (*sessionv1.NewSessionResponse, error) {
	id := ids.New("sess_")
	subject, err := bus.SessionUpdateSubject(id, 1)
	if err != nil {
		return nil, err
	}
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: "default", UpdateSubject: subject, Created: true}, nil
}

func (openClose) Close(_ context.Context, req *sessionv1.CloseRequest) (*sessionv1.CloseResponse, error) {
	return &sessionv1.CloseResponse{SessionId: req.GetSessionId(), Closed: true}, nil
}

func (openClose) Kill(_ context.Context, req *sessionv1.KillRequest) (*sessionv1.KillResponse, error) {
	return &sessionv1.KillResponse{SessionId: req.GetSessionId(), Killed: true}, nil
}

func (openClose) ConnectionClosed(context.Context, *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	return &sessionv1.ConnectionClosedResponse{}, nil
}

// A connection followed every session it made until it ended, closed or
// not: 2,000 rounds of session/new and session/close left the gateway 2,000
// NATS subscriptions and goroutines, and any number more. A session the
// connection closes or kills is no longer followed; one another
// connection closes stays followed, up to maxFollowed a connection, past
// which session/new is refused.
func TestClosedSessionsAreNotFollowed(t *testing.T) {
	defer func(n int) { maxFollowed = n }(maxFollowed)
	maxFollowed = 40
	g, socket := runGateway(t, openClose{}, 10*time.Second)
	c := dialInitialized(t, socket)
	defer c.Close()
	newSession := func() (string, error) {
		raw, err := c.Call("session/new", map[string]any{})
		if err != nil {
			return "", err
		}
		var r struct {
			SessionID string `json:"session_id"`
		}
		return r.SessionID, json.Unmarshal(raw, &r)
	}
	followed := func() int {
		g.hub.mu.Lock()
		defer g.hub.mu.Unlock()
		return len(g.hub.topics)
	}
	subs := g.nats.NumSubscriptions()
	for i := range 3 * maxFollowed {
		id, err := newSession()
		if err != nil {
			t.Fatalf("new %d: %v", i, err)
		}
		end := "session/close"
		if i%2 == 1 {
			end = "session/kill"
		}
		if _, err := c.Call(end, map[string]any{"session_id": id}); err != nil {
			t.Fatalf("%s %d: %v", end, i, err)
		}
	}
	if n := followed(); n != 0 || g.nats.NumSubscriptions() != subs {
		t.Fatalf("after %d sessions made and ended: %d followed, %d subscriptions (%d before)", 3*maxFollowed, n, g.nats.NumSubscriptions(), subs)
	}

	// Closed by another connection: followed until the bound.
	other := dialInitialized(t, socket)
	defer other.Close()
	for i := range maxFollowed {
		id, err := newSession()
		if err != nil {
			t.Fatalf("new %d: %v", i, err)
		}
		if _, err := other.Call("session/close", map[string]any{"session_id": id}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := newSession()
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || re.Code != jsonrpc.CodeSessionLimit {
		t.Fatalf("a session past the bound: %v", err)
	}
	if n := followed(); n != maxFollowed {
		t.Fatalf("%d followed, the bound %d", n, maxFollowed)
	}
	// Its end lets go of all of them.
	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for followed() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d still followed after the connection ended", followed())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// slowNew is openClose whose session/new takes a moment, counting the
// sessions it makes.
type slowNew struct {
	openClose
	made atomic.Int64
}

func (s *slowNew) NewSession(ctx context.Context, req *sessionv1.NewSessionRequest) (*sessionv1.NewSessionResponse, error) {
	time.Sleep(100 * time.Millisecond)
	s.made.Add(1)
	return s.openClose.NewSession(ctx, req)
}

// Concurrent session/new calls at the follow bound: each holds its follow
// from before it asks the session service, so one makes a session and
// the others are refused without making any. Checked only before the
// call, each made a session and the later ones were refused -32001 for
// sessions left made and unfollowed.
func TestSessionNewAtTheFollowBoundMakesNothingItRefuses(t *testing.T) {
	// Restored after the gateway's own cleanup: its handlers read it.
	t.Cleanup(func(n int) func() { return func() { maxFollowed = n } }(maxFollowed))
	maxFollowed = 4
	sess := &slowNew{}
	g, socket := runGateway(t, sess, 10*time.Second)
	c := dialInitialized(t, socket)
	defer c.Close()
	for range maxFollowed - 1 {
		if _, err := c.Call("session/new", map[string]any{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session/new","params":{}}`, 100+i)); err != nil {
			t.Fatal(err)
		}
	}
	made, refused := 0, 0
	for range 4 {
		f, _, err := c.Read(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case f.Error == nil:
			made++
		case f.Error.Code == jsonrpc.CodeSessionLimit:
			refused++
		default:
			t.Fatalf("session/new: %v", f.Error)
		}
	}
	if made != 1 || refused != 3 || sess.made.Load() != int64(maxFollowed) {
		t.Fatalf("%d made, %d refused, %d sessions made by the service; want 1, 3, %d", made, refused, sess.made.Load(), maxFollowed)
	}
	// A prompt to a session not followed is refused at the bound too,
	// before the session service is asked (it serves no Attach here).
	_, err := c.Call("session/prompt", map[string]any{"session_id": ids.New("sess_"), "prompt": "hi"})
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || re.Code != jsonrpc.CodeSessionLimit {
		t.Fatalf("a prompt past the bound: %v", err)
	}
	g.hub.mu.Lock()
	defer g.hub.mu.Unlock()
	if n := len(g.hub.topics); n != maxFollowed {
		t.Fatalf("%d followed", n)
	}
}
