package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// awaySession answers Status as a session service whose database is away.
type awaySession struct {
	sessionv1.UnimplementedSessionServiceServer
}

func (awaySession) Status(context.Context, *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	return nil, status.Error(codes.Unavailable, "session: database unavailable")
}

func (awaySession) ConnectionClosed(context.Context, *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	return &sessionv1.ConnectionClosedResponse{}, nil
}

// status failed as a whole when the session service could not list the
// open sessions, saying nothing of the services, exactly when an
// operator asks it why the stack does not serve. It still fails (its
// counts are unknown), and its data holds the services as status shows
// them.
func TestStatusSaysTheServicesWhenSessionsAreUnknown(t *testing.T) {
	_, socket := runGateway(t, awaySession{}, 5*time.Second, func(g *Gateway) {
		g.monitor.addSelf(func() string { return "" })
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	_, err := c.Call("status", nil)
	var rpcErr *rpcclient.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeInternal || rpcErr.Message != "session unavailable" {
		t.Fatalf("status: %v, want -32603 session unavailable", err)
	}
	var data struct {
		Services map[string]string `json:"services"`
	}
	if err := json.Unmarshal(rpcErr.Data, &data); err != nil || data.Services[SelfName] == "" {
		t.Fatalf("status's error data %s: want the services (%v)", rpcErr.Data, err)
	}
}
