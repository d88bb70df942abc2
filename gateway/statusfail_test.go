package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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
// open sessions (-32603 "session unavailable", the services only in its
// data), exactly when an operator asks it why the stack does not serve,
// and a client polling it showed the whole daemon as down. It answers
// now, every member as ever, the services as the monitor saw them, and
// sessions_unavailable saying why the counts are unknown.
func TestStatusSaysTheServicesWhenSessionsAreUnknown(t *testing.T) {
	_, socket := runGateway(t, awaySession{}, 5*time.Second, func(g *Gateway) {
		g.monitor.addSelf(func() string { return "" })
		g.statusFixed = encodeStatusFixed("0.1.0", "/data", g.cfg.Socket)
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	// The gateway's own line holds from the first call, before the
	// monitor's first poll (TestStatusSaysTheGatewayFromTheFirstAnswer).
	raw, err := c.Call("status", nil)
	if err != nil {
		t.Fatalf("status failed while the session service is away: %v", err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{"server_version", "protocol_version", "active_sessions", "session_ids", "config_dir", "local_ipc_endpoint", "services"} {
		if _, ok := got[member]; !ok {
			t.Errorf("status %s: no %s", raw, member)
		}
	}
	var st struct {
		Active   *int64            `json:"active_sessions"`
		IDs      []string          `json:"session_ids"`
		Services map[string]string `json:"services"`
		Why      string            `json:"sessions_unavailable"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Why != "session unavailable" || st.Active == nil || *st.Active != 0 || st.IDs == nil || len(st.IDs) != 0 ||
		st.Services[SelfName] != "serving" {
		t.Fatalf("status while the session service is away: %s", raw)
	}
}

// A refusal of the caller is no outage: status fails with it as before.
type refusingSession struct{ awaySession }

func (refusingSession) Status(context.Context, *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	return nil, status.Error(codes.PermissionDenied, "not yours")
}

func TestStatusRefusedIsStillAFailure(t *testing.T) {
	_, socket := runGateway(t, refusingSession{}, 5*time.Second)
	c := dialInitialized(t, socket)
	defer c.Close()
	raw, err := c.Call("status", nil)
	var rpcErr *rpcclient.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code == jsonrpc.CodeInternal {
		t.Fatalf("status refused by the session service: %s, %v", raw, err)
	}
}

// With the session service hung (SIGSTOPped), status took the whole call
// deadline (8.7 s) to say what health said within a poll. Once the
// monitor found the service unreachable, status gives it a short while
// and answers, sessions_unavailable saying so; here the call deadline is
// an hour.
func TestStatusDoesNotWaitOutAnUnreachableSession(t *testing.T) {
	sess := newHungSession(t)
	_, socket := runGateway(t, sess, time.Hour, func(g *Gateway) {
		g.monitor.state["session"] = &component{Status: "unreachable"}
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	if err := c.Send(`{"jsonrpc":"2.0","id":1,"method":"status","params":{}}`); err != nil {
		t.Fatal(err)
	}
	f, _, err := c.Read(30 * time.Second)
	if err != nil || f.Error != nil || !strings.Contains(string(f.Result), `"sessions_unavailable":"session unavailable"`) {
		t.Fatalf("status with the session service unreachable: %+v, %v", f, err)
	}
}
