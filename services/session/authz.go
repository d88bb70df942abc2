package session

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
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
		return status.Error(codes.Unavailable, fmt.Sprintf("authorize %s: config service unavailable", PermAgentUse))
	}
	return err
}
