package session

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// PermAgentUse is the permission to run turns with an agent alias.
const PermAgentUse = "agent:use"

// Authorizer answers whether a principal holds a permission on a resource:
// the config service's Authorize in production.
type Authorizer interface {
	Authorize(ctx context.Context, p *configv1.Principal, permission, resource string) (allowed bool, reason string, err error)
}

// ConfigAuthorizer asks the config service.
type ConfigAuthorizer struct{ Client configv1.ConfigServiceClient }

// Authorize implements Authorizer.
func (a ConfigAuthorizer) Authorize(ctx context.Context, p *configv1.Principal, permission, resource string) (bool, string, error) {
	resp, err := a.Client.Authorize(ctx, &configv1.AuthorizeRequest{Principal: p, Permission: permission, Resource: resource})
	if err != nil {
		return false, "", err
	}
	return resp.GetAllowed(), resp.GetReason(), nil
}

// mayUseAgent refuses a principal without agent:use on alias. The operator
// holds every permission and is not asked about; without an Authorizer
// (tests, demos) every principal may.
func (s *Server) mayUseAgent(ctx context.Context, p *configv1.Principal, alias string) error {
	if p.GetOperator() || s.cfg.Authz == nil {
		return nil
	}
	ok, reason, err := s.cfg.Authz.Authorize(ctx, p, PermAgentUse, alias)
	if err != nil {
		return fmt.Errorf("authorize %s: %w", PermAgentUse, err)
	}
	if !ok {
		msg := fmt.Sprintf("%s may not use the agent `%s`", p.GetPrincipalId(), alias)
		if reason != "" {
			msg += ": " + reason
		}
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, msg)
	}
	return nil
}
