package session

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// configDown cannot ask the config service, as configclient.Authorize
// says of one down or hung.
type configDown struct{}

func (configDown) Authorize(context.Context, *commonv1.Principal, string, string) error {
	return fmt.Errorf("%w: %w", configclient.ErrConfigUnavailable, status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
}

// A user's session call that the config service could not authorize
// (config down or hung) reached the client as "session unavailable",
// naming a service that was up: the session service's Unavailable
// carried no reason, and the gateway names the service it called. It
// now carries the dependency reason, and the client reads which
// service is away.
func TestConfigAwayNamedToTheClient(t *testing.T) {
	ctx := context.Background()
	var st Standing
	st.Set(configDown{})
	_, standing := st.Unary(ctx, &sessionv1.MessagesRequest{Principal: alice},
		&grpc.UnaryServerInfo{FullMethod: sessionv1.SessionService_Messages_FullMethodName},
		func(context.Context, any) (any, error) { return "ok", nil })
	srv := &Server{cfg: Config{Authz: configDown{}}}
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"standing":     {standing, "session: config service unavailable (checking the caller's binding)"},
		"agent:use":    {srv.mayUseAgent(ctx, alice, "default"), "session: config service unavailable (authorizing agent:use)"},
		"files:create": {srv.authorize(ctx, alice, configschema.PermFilesCreate, ""), "session: config service unavailable (authorizing files:create)"},
	} {
		we := errmap.ToWire("session", c.err)
		if we.Code != jsonrpc.CodeInternal || we.Message != c.want || status.Code(c.err) != codes.Unavailable {
			t.Errorf("%s with config away: %d %q (%v), want %d %q", name, we.Code, we.Message, c.err, jsonrpc.CodeInternal, c.want)
		}
	}
}
