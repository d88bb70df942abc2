package session

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// PermAgentUse is the permission to run turns with an agent alias.
const PermAgentUse = configschema.PermAgentUse

// Authorizer answers whether a principal holds a permission on a resource:
// nil when it does, a PermissionDenied status ready for the gateway when
// not. configclient.Client is the production one.
type Authorizer interface {
	Authorize(ctx context.Context, p *commonv1.Principal, permission, resource string) error
}

// mayUseAgent refuses a principal without agent:use on alias. The operator
// holds every permission and is not asked about; without an Authorizer
// (tests, demos) every principal may.
func (s *Server) mayUseAgent(ctx context.Context, p *commonv1.Principal, alias string) error {
	if p.GetOperator() || s.cfg.Authz == nil {
		return nil
	}
	err := s.cfg.Authz.Authorize(ctx, p, PermAgentUse, alias)
	if errors.Is(err, configclient.ErrConfigUnavailable) {
		return configAway(PermAgentUse)
	}
	return err
}

// configAway is the failure of a call the config service could not
// authorize (down, or hung past the call's deadline), named as the
// dependency's: a bare Unavailable reached the client as "session
// unavailable", naming the session service, which was up.
func configAway(permission string) error {
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex,
		fmt.Sprintf("config service unavailable (authorizing %s)", permission))
}
