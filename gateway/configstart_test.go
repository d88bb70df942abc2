package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// liveConfig is an awayConfig that also serves Live, with doc.
type liveConfig struct {
	awayConfig
	doc map[string]any
}

func (l *liveConfig) Live(context.Context, *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	doc, err := structpb.NewStruct(l.doc)
	if err != nil {
		return nil, err
	}
	return &configv1.LiveResponse{Revision: 1, Document: doc}, nil
}

// startWithoutConfig builds a gateway with New whose config service's
// socket listens but is never served (a hung process: connections wait
// in its backlog), runs it, and returns the gateway, its client socket,
// Run's result and the config socket's listener, which the test serves
// to bring config back.
func startWithoutConfig(t *testing.T) (*Gateway, string, chan error, net.Listener) {
	t.Helper()
	was := configStartWait
	configStartWait = 200 * time.Millisecond
	t.Cleanup(func() { configStartWait = was })
	dir := t.TempDir()
	cfgLn, err := net.Listen("unix", filepath.Join(dir, "config.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cfgLn.Close() })
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	socket := filepath.Join(dir, "gw.sock")
	// The test's bound of patience, far past the gateway's own wait for
	// config at start; New used to wait for config up to 60 s and fail.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := New(ctx, Config{
		DataDir: dir, Socket: socket, NATS: nc, Log: zap.NewNop(),
		ConfigAddr: filepath.Join(dir, "config.sock"), SessionAddr: filepath.Join(dir, "session.sock"),
	})
	if err != nil {
		t.Fatalf("the gateway did not start with config hung: %v", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		testwait.Recv(t, ran)
		g.Close()
	})
	return g, socket, ran, cfgLn
}

// The gateway could not start at all while the config service was away:
// New read rpc.* from config's Live and, with config hung or down, failed
// after 60 s, so that the process was restarted in a loop and no client,
// the operator included, got an answer. It now starts on the schema's
// defaults, health says config is unreachable, principal resolution
// still fails closed (only the operator by its uid is bound, a token is
// refused), and once config answers with the same rpc.* it goes on.
func TestGatewayStartsWhileConfigIsAway(t *testing.T) {
	g, socket, ran, cfgLn := startWithoutConfig(t)
	if want := (configclient.Snapshot{}).RPCLimits(); g.limits != want {
		t.Fatalf("limits without config: %+v, want the defaults %+v", g.limits, want)
	}
	c, err := rpcclient.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	init, err := c.Initialize()
	if err != nil || init["principal_id"] != "shared-operator" || init["config_unavailable"] == nil {
		t.Fatalf("the operator's initialize with config away: %v, %v", init, err)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		h, err := healthComponents(c)
		if err != nil {
			return err
		}
		if h["config"] != "unreachable" {
			return errors.New("config is " + h["config"])
		}
		return nil
	})
	// A token is config's to check: no fallback.
	_, err = initialize(t, socket, "cmt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || re.Code != jsonrpc.CodeInternal {
		t.Fatalf("a token's initialize with config away: %v", err)
	}

	// Config comes back with the defaults: the gateway goes on, and a
	// new connection is resolved by config.
	cfg := &liveConfig{doc: map[string]any{}}
	srv := grpc.NewServer()
	configv1.RegisterConfigServiceServer(srv, cfg)
	go srv.Serve(cfgLn) //nolint:errcheck // ends at Stop
	t.Cleanup(srv.Stop)
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		init, err := initialize(t, socket)
		if err != nil {
			return err
		}
		if _, ok := init["config_unavailable"]; ok {
			return errors.New("still bound without config")
		}
		return nil
	})
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if g.configAway.Load() {
			return errors.New("still waiting for config's rpc.*")
		}
		return nil
	})
	select {
	case err := <-ran:
		t.Fatalf("the gateway stopped with config back on the defaults: %v", err)
	default:
	}
	if _, err := c.Call("health", nil); err != nil {
		t.Fatalf("health on the first connection: %v", err)
	}
}

// Config comes back with rpc.* other than the defaults the gateway
// started on: they are read only at start, so the gateway stops, saying
// why, for its supervisor to start it again on them.
func TestGatewayStartedWithoutConfigRestartsForItsSettings(t *testing.T) {
	_, _, ran, cfgLn := startWithoutConfig(t)
	cfg := &liveConfig{doc: map[string]any{"rpc": map[string]any{"max_local_connections": 64}}}
	srv := grpc.NewServer()
	configv1.RegisterConfigServiceServer(srv, cfg)
	go srv.Serve(cfgLn) //nolint:errcheck // ends at Stop
	t.Cleanup(srv.Stop)
	err := testwait.Recv(t, ran)
	if !errors.Is(err, ErrConfigSettingsDiffer) {
		t.Fatalf("run: %v, want %v", err, ErrConfigSettingsDiffer)
	}
	ran <- nil // for the cleanup
}

// healthComponents is health's status word of each component.
func healthComponents(c *rpcclient.Client) (map[string]string, error) {
	var h struct {
		Components map[string]struct {
			Status string `json:"status"`
		} `json:"components"`
	}
	raw, err := c.Call("health", nil)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for name, comp := range h.Components {
		out[name] = comp.Status
	}
	return out, nil
}
