package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// busGoneOnNew makes a session at session/new, as openClose does, and
// runs gone before it answers: the bus server goes away after the
// gateway saw its link up and before it follows the session. It records
// the sessions deleted.
type busGoneOnNew struct {
	openClose
	gone    func()
	created bool

	mu      sync.Mutex
	deleted []string
}

func (s *busGoneOnNew) NewSession(ctx context.Context, req *sessionv1.NewSessionRequest) (*sessionv1.NewSessionResponse, error) {
	resp, err := s.openClose.NewSession(ctx, req)
	if err != nil {
		return nil, err
	}
	resp.Created = s.created
	s.gone()
	return resp, nil
}

func (s *busGoneOnNew) Delete(_ context.Context, req *sessionv1.DeleteRequest) (*sessionv1.DeleteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleted = append(s.deleted, req.GetSessionId())
	return &sessionv1.DeleteResponse{SessionId: req.GetSessionId(), Deleted: true}, nil
}

func (s *busGoneOnNew) deletes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.deleted...)
}

// A session/new whose session the gateway cannot follow (its bus link
// lost between the check of busDown and the subscription: a server
// stopped is seen only two missed pings on) fails "bus unavailable"
// and leaves no session made behind it. Before, the session it made
// stayed open, its id told to no client and followed by none: one more
// at each retry. A session it resumed, which was there before the call,
// is left as it is.
func TestNewSessionNotFollowedIsUndone(t *testing.T) {
	for _, created := range []bool{true, false} {
		srv := testenv.StartNATS(t)
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		fake := &busGoneOnNew{gone: srv.Shutdown, created: created}
		_, socket := runGateway(t, fake, 30*time.Second, func(g *Gateway) {
			g.nats, g.hub = nc, newHub(nc, zap.NewNop(), nil)
		})
		c := dialInitialized(t, socket)
		_, err = c.Call("session/new", map[string]any{})
		c.Close()
		var re *rpcclient.RPCError
		if !errors.As(err, &re) || re.Message != "gateway: bus unavailable" {
			t.Fatalf("session/new with the bus gone: %v, want gateway: bus unavailable", err)
		}
		switch got := fake.deletes(); {
		case created && len(got) != 1:
			t.Errorf("a session made by a session/new that failed: deleted %q, want it deleted", got)
		case !created && len(got) != 0:
			t.Errorf("a session resumed by a session/new that failed: deleted %q, want it left", got)
		}
	}
}
