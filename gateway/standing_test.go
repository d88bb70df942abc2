package gateway

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configschema"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// aliceConfig binds every connection to the user alice, by a token, and
// answers that she stands until revoked is set.
type aliceConfig struct {
	configv1.UnimplementedConfigServiceServer
	revoked atomic.Bool
	asked   atomic.Int64
}

func (c *aliceConfig) ResolvePrincipal(context.Context, *configv1.ResolvePrincipalRequest) (*configv1.ResolvePrincipalResponse, error) {
	return &configv1.ResolvePrincipalResponse{Principal: &commonv1.Principal{PrincipalId: "user:alice", User: "alice", TokenId: "t-1"}}, nil
}

func (c *aliceConfig) Authorize(_ context.Context, req *configv1.AuthorizeRequest) (*configv1.AuthorizeResponse, error) {
	if req.GetPermission() != configschema.PermStanding {
		return nil, status.Error(codes.Internal, "asked "+req.GetPermission())
	}
	c.asked.Add(1)
	if c.revoked.Load() {
		return &configv1.AuthorizeResponse{Reason: `the token of user "alice" was revoked`}, nil
	}
	return &configv1.AuthorizeResponse{Allowed: true}, nil
}

// A connection bound by a token revoked since went on receiving the
// updates of the sessions it followed (the operator's turns, the
// phone's), while each of its calls was refused. The gateway asks, once a
// tick, whether the users of its connections stand, and a connection whose
// user does not follows nothing more.
func TestRevokedConnectionFollowsNothing(t *testing.T) {
	defer func(d time.Duration) { standingEvery = d }(standingEvery)
	standingEvery = 20 * time.Millisecond
	cfg := &aliceConfig{}
	g, socket := runGateway(t, openClose{}, 10*time.Second, func(g *Gateway) {
		g.config = configv1.NewConfigServiceClient(serveFake(t, func(s *grpc.Server) { configv1.RegisterConfigServiceServer(s, cfg) }))
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	for range 3 {
		if _, err := c.Call("session/new", map[string]any{}); err != nil {
			t.Fatal(err)
		}
	}
	followed := func() int {
		g.hub.mu.Lock()
		defer g.hub.mu.Unlock()
		return len(g.hub.topics)
	}
	// Standing: asked, and nothing dropped.
	for deadline := time.Now().Add(5 * time.Second); cfg.asked.Load() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never asked whether its user stands")
		}
	}
	if n := followed(); n != 3 {
		t.Fatalf("a standing user's connection follows %d sessions, want 3", n)
	}
	cfg.revoked.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for followed() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a revoked user's connection still follows %d sessions", followed())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
