package gateway

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// standingEvery is how often the gateway asks whether the users its
// connections are bound to still stand; a variable so that a test may
// shorten it.
var standingEvery = time.Second

// watchStanding stops the session updates of connections whose user no
// longer stands: its tokens revoked, the user removed, its uid changed.
// The services refuse such a connection's calls at once (the session
// service's interceptor), but what the connection already followed kept
// streaming to it: the operator's turns, and the phone's, in sessions it
// had followed, answers and approvals included. Nothing announces a
// revocation, so the gateway asks, for each distinct user principal it
// has bound, once a tick; a connection found revoked follows nothing
// more, within a tick of the revocation. With no user connected it asks
// nothing.
func (g *Gateway) watchStanding(ctx context.Context) {
	t := time.NewTicker(standingEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.checkStanding(ctx)
	}
}

func (g *Gateway) checkStanding(ctx context.Context) {
	byKey := map[string][]*connState{}
	principals := map[string]*commonv1.Principal{}
	g.mu.Lock()
	states := make([]*connState, 0, len(g.states))
	for _, cs := range g.states {
		states = append(states, cs)
	}
	g.mu.Unlock()
	for _, cs := range states {
		p := cs.principalOf()
		if p == nil || p.GetOperator() {
			continue
		}
		key := fmt.Sprintf("%s\x00%s\x00%d", p.GetPrincipalId(), p.GetTokenId(), p.GetPeerUid())
		byKey[key] = append(byKey[key], cs)
		principals[key] = p
	}
	for key, p := range principals {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := configclient.Authorize(cctx, g.config, p, configschema.PermStanding, "")
		cancel()
		if status.Code(err) != codes.PermissionDenied {
			continue // standing, or not asked: the next tick asks again
		}
		for _, cs := range byKey[key] {
			// Bound since to someone else (initialize again): theirs.
			if cs.principalOf() != p {
				continue
			}
			g.hub.detach(cs, "")
			g.log.Info("connection's user no longer stands; its sessions are no longer followed",
				zap.String("conn", cs.id), zap.String("principal", p.GetPrincipalId()), zap.Error(err))
		}
	}
}
