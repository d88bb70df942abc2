package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Modes of awayConfig.
const (
	configAnswers int32 = iota
	configDown          // Unavailable, as gRPC says of a killed process
	configHung          // no answer until the caller's deadline (SIGSTOP)
	configRefuses       // an answer: the peer is nobody it knows
)

// awayConfig is a config service that answers, is down, hangs or refuses
// as the test sets mode.
type awayConfig struct {
	configv1.UnimplementedConfigServiceServer
	mode atomic.Int32
}

func (a *awayConfig) ResolvePrincipal(ctx context.Context, _ *configv1.ResolvePrincipalRequest) (*configv1.ResolvePrincipalResponse, error) {
	switch a.mode.Load() {
	case configDown:
		return nil, status.Error(codes.Unavailable, "connection refused")
	case configHung:
		<-ctx.Done()
		return nil, ctx.Err()
	case configRefuses:
		return nil, rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex, "peer uid is not known")
	}
	return &configv1.ResolvePrincipalResponse{Principal: &commonv1.Principal{PrincipalId: "shared-operator", Operator: true}}, nil
}

// statusSession answers Status with no sessions open.
type statusSession struct{ awaySession }

func (statusSession) Status(context.Context, *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	return &sessionv1.StatusResponse{SessionIds: []string{}}, nil
}

// runWithConfig runs a gateway whose config service is cfg and whose own
// uid is uid; the monitor says config is status (when not empty).
func runWithConfig(t *testing.T, cfg *awayConfig, callTimeout time.Duration, uid int64, configStatus string) string {
	t.Helper()
	_, socket := runGateway(t, statusSession{}, callTimeout, func(g *Gateway) {
		g.config = configv1.NewConfigServiceClient(serveFake(t, func(s *grpc.Server) { configv1.RegisterConfigServiceServer(s, cfg) }))
		g.uid = uid
		if configStatus != "" {
			g.monitor.state["config"] = &component{Status: configStatus}
			g.monitor.encodeLocked()
		}
	})
	return socket
}

func initialize(t *testing.T, socket string, token ...string) (map[string]any, error) {
	t.Helper()
	c, err := rpcclient.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.Initialize(token...)
}

// With the config service down or hung, initialize asked it who the
// caller was and failed ("config unavailable" after 9 s of a SIGSTOPped
// one), so that health and status, which need an initialized
// connection, told the operator nothing exactly when something was
// wrong. A tokenless local peer with the gateway's own uid is now bound
// as the operator without config, the result saying so; health and
// status answer on that connection, status showing config unreachable.
func TestOperatorInitializesWithoutConfig(t *testing.T) {
	for _, tc := range []struct {
		name         string
		mode         int32
		callTimeout  time.Duration
		configStatus string
		why          string
	}{
		{"down", configDown, 5 * time.Second, "", "config unavailable"},
		// The monitor found it unanswering: the call deadline (an hour
		// here) is not waited out.
		{"hung", configHung, time.Hour, "unreachable", "config timed out"},
		// Not yet seen by the monitor: the call's own deadline ends it.
		{"hung unseen", configHung, 300 * time.Millisecond, "", "config timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &awayConfig{}
			cfg.mode.Store(tc.mode)
			socket := runWithConfig(t, cfg, tc.callTimeout, int64(os.Getuid()), tc.configStatus)
			c, err := rpcclient.Dial(socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			init, err := c.Initialize()
			if err != nil {
				t.Fatalf("the operator's initialize with config %s: %v", tc.name, err)
			}
			if init["principal_id"] != "shared-operator" || init["config_unavailable"] != tc.why {
				t.Fatalf("initialize with config %s: %v", tc.name, init)
			}
			if _, err := c.Call("health", nil); err != nil {
				t.Fatalf("health: %v", err)
			}
			raw, err := c.Call("status", nil)
			if err != nil {
				t.Fatalf("status: %v", err)
			}
			var st struct {
				Services map[string]string `json:"services"`
			}
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatal(err)
			}
			if tc.configStatus != "" && st.Services["config"] != tc.configStatus {
				t.Fatalf("status: %s", raw)
			}

			// Config back: a new connection is resolved by it again.
			cfg.mode.Store(configAnswers)
			init, err = initialize(t, socket)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := init["config_unavailable"]; ok || init["principal_id"] != "shared-operator" {
				t.Fatalf("initialize with config back: %v", init)
			}
		})
	}
}

// Only the operator is bound without config: a peer of another uid, a
// token (even from the operator's uid) and a refusal by config still
// fail initialize.
func TestInitializeWithoutConfigIsTheOperatorsAlone(t *testing.T) {
	wantErr := func(t *testing.T, err error, code int64, msg string) {
		t.Helper()
		var re *rpcclient.RPCError
		if !errors.As(err, &re) || re.Code != code || re.Message != msg {
			t.Fatalf("initialize: %v, want %d %q", err, code, msg)
		}
	}
	t.Run("another uid", func(t *testing.T) {
		cfg := &awayConfig{}
		cfg.mode.Store(configDown)
		// The peer (this process) is not the gateway's uid.
		socket := runWithConfig(t, cfg, 5*time.Second, int64(os.Getuid())+1, "unreachable")
		_, err := initialize(t, socket)
		wantErr(t, err, jsonrpc.CodeInternal, "config unavailable")
	})
	t.Run("a token", func(t *testing.T) {
		cfg := &awayConfig{}
		cfg.mode.Store(configDown)
		socket := runWithConfig(t, cfg, 5*time.Second, int64(os.Getuid()), "unreachable")
		_, err := initialize(t, socket, "cmt_whatever")
		wantErr(t, err, jsonrpc.CodeInternal, "config unavailable")
	})
	t.Run("a refusal", func(t *testing.T) {
		cfg := &awayConfig{}
		cfg.mode.Store(configRefuses)
		socket := runWithConfig(t, cfg, 5*time.Second, int64(os.Getuid()), "")
		_, err := initialize(t, socket)
		wantErr(t, err, jsonrpc.CodeAuthRequired, "peer uid is not known")
	})
}

// The decision alone: which peers, which errors.
func TestOperatorWithoutConfigDecision(t *testing.T) {
	g := &Gateway{uid: 1000}
	for _, tc := range []struct {
		uid       int32
		transport string
		token     string
		want      bool
	}{
		{1000, transportLocal, "", true},
		{1001, transportLocal, "", false},
		{0, transportLocal, "", false},
		{-1, transportLocal, "", false}, // no credentials
		{1000, transportLocal, "cmt_x", false},
		{1000, "wss", "", false},
	} {
		cs := &connState{transport: tc.transport, peer: jsonrpc.Peer{UID: tc.uid, PID: 1}}
		if got := g.operatorWithoutConfig(cs, tc.token); got != tc.want {
			t.Errorf("uid %d over %q, token %q: %v, want %v", tc.uid, tc.transport, tc.token, got, tc.want)
		}
	}
	// (uid_t)-1 as the gateway's own uid matches no peer's "no credentials".
	if (&Gateway{uid: 1<<32 - 1}).operatorWithoutConfig(&connState{transport: transportLocal, peer: jsonrpc.Peer{UID: -1}}, "") {
		t.Error("a peer without credentials matched")
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "connection refused"), true},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), true},
		{status.Error(codes.Canceled, "the client left"), false},
		{context.Canceled, false},
		{rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex, "not paired"), false},
		{rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "database unavailable"), false},
		{status.Error(codes.Internal, "boom"), false},
	} {
		if got := configUnreachable(tc.err); got != tc.want {
			t.Errorf("configUnreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
