package session

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// Standing refuses every call of a user principal whose binding no longer
// stands: the user removed, its token revoked, its uid changed. Only a
// prompt, a new session and the file methods asked the config service;
// reading a transcript, listing, closing, deleting or approving checked
// the session's owner alone, so a connection bound by a revoked token went
// on with its sessions (docs/spec.md §4: revoking a user's tokens ends
// the authority of the connections they bound). It is a gRPC interceptor,
// one place for every method that names a principal; the operator is
// never asked about (a connection's end, ConnectionClosed, names none).
type Standing struct {
	authz atomic.Pointer[Authorizer]
	// Refused, when set, is given each request refused before its
	// handler ran, to release what the handler would have: a StoreFile's
	// bytes, lent by the codec to the handler, which gives them back.
	Refused func(req any)
}

// Set gives s the authorizer it asks; until then it asks nothing.
func (s *Standing) Set(a Authorizer) { s.authz.Store(&a) }

// Unary is the interceptor.
func (s *Standing) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.check(ctx, req); err != nil {
		if s.Refused != nil {
			s.Refused(req)
		}
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Standing) check(ctx context.Context, req any) error {
	a := s.authz.Load()
	r, ok := req.(interface{ GetPrincipal() *commonv1.Principal })
	if a == nil || !ok {
		return nil
	}
	p := r.GetPrincipal()
	if p == nil || p.GetOperator() {
		return nil
	}
	err := (*a).Authorize(ctx, p, configschema.PermStanding, "")
	if status.Code(err) == codes.PermissionDenied {
		return err
	}
	if err != nil {
		// Named as the dependency's failure: a bare Unavailable reached
		// the client as "session unavailable", the session service being
		// up.
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "config service unavailable (checking the caller's binding)")
	}
	return nil
}
