package gateway

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// hungConfig answers nothing until the caller's deadline, as a
// SIGSTOPped config service does.
type hungConfig struct {
	configv1.UnimplementedConfigServiceServer
}

func (hungConfig) hang(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

func (h hungConfig) ResolvePrincipal(ctx context.Context, _ *configv1.ResolvePrincipalRequest) (*configv1.ResolvePrincipalResponse, error) {
	return nil, h.hang(ctx)
}

func (h hungConfig) Get(ctx context.Context, _ *configv1.GetRequest) (*configv1.GetResponse, error) {
	return nil, h.hang(ctx)
}

func (h hungConfig) List(ctx context.Context, _ *configv1.ListRequest) (*configv1.ListResponse, error) {
	return nil, h.hang(ctx)
}

func (h hungConfig) Set(ctx context.Context, _ *configv1.SetRequest) (*configv1.SetResponse, error) {
	return nil, h.hang(ctx)
}

func (h hungConfig) SetMany(ctx context.Context, _ *configv1.SetManyRequest) (*configv1.SetManyResponse, error) {
	return nil, h.hang(ctx)
}

func (h hungConfig) Delete(ctx context.Context, _ *configv1.DeleteRequest) (*configv1.DeleteResponse, error) {
	return nil, h.hang(ctx)
}

func (h hungConfig) Authorize(ctx context.Context, _ *configv1.AuthorizeRequest) (*configv1.AuthorizeResponse, error) {
	return nil, h.hang(ctx)
}

// With config hung and the monitor already showing it unreachable, the
// operator's config calls waited the whole call deadline (10 s for a
// read, 30 s for a write by default; an hour here, so that the client
// gave up first) to say "config timed out". They are now cut as status
// and initialize are (awayStatusWait), and say that config does not
// answer, a write that its change may still be applied.
func TestConfigCallsWhileConfigIsHung(t *testing.T) {
	_, socket := runGateway(t, statusSession{}, time.Hour, func(g *Gateway) {
		g.config = configv1.NewConfigServiceClient(serveFake(t, func(s *grpc.Server) { configv1.RegisterConfigServiceServer(s, hungConfig{}) }))
		g.uid = int64(os.Getuid())
		g.cfg.PluginAddrs = []string{"/nonexistent/plugin-sandbox.sock"}
		g.monitor.state["config"] = &component{Status: "unreachable"}
		g.monitor.encodeLocked()
	})
	c, err := rpcclient.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Timeout = 20 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	const (
		read  = "config: not answering (hung: its health check goes unanswered too)"
		write = read + "; the change may still be applied once it answers"
	)
	for _, tc := range []struct {
		method string
		params any
		want   string
	}{
		{"config/get", map[string]any{"prop": "rpc.call_timeout_ms"}, read},
		{"config/list", map[string]any{}, read},
		{"config/set", map[string]any{"prop": "rpc.call_timeout_ms", "value": 2000}, write},
		{"config/set-many", map[string]any{"sets": []any{map[string]any{"prop": "rpc.call_timeout_ms", "value": 2000}}}, write},
		{"config/delete", map[string]any{"prop": "rpc.call_timeout_ms"}, write},
		{"plugins/list", map[string]any{}, read},
	} {
		_, err := c.Call(tc.method, tc.params)
		var re *rpcclient.RPCError
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInternal || re.Message != tc.want {
			t.Errorf("%s with config hung: %v, want %d %q", tc.method, err, jsonrpc.CodeInternal, tc.want)
		}
	}
}

// slowConfig answers Set once the test releases it: a config service
// that is slow for a moment, and alive.
type slowConfig struct {
	fakeConfig
	entered chan struct{}
	release chan struct{}
}

func (s slowConfig) Set(ctx context.Context, req *configv1.SetRequest) (*configv1.SetResponse, error) {
	s.entered <- struct{}{}
	select {
	case <-s.release:
		return &configv1.SetResponse{Prop: req.GetProp()}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// One health poll of config that timed out (a config slow for a moment)
// cut every config call to awayStatusWait for as long as the monitor's
// record said unreachable, a call in flight when config answered again
// included: a config/set that config was serving failed with "not
// answering (hung: its health check goes unanswered too)" though health
// had found config serving meanwhile. A call is now cut only if health
// still finds config unanswering once the wait is over.
func TestConfigCallGoesOnOnceConfigAnswersAgain(t *testing.T) {
	cfg := slowConfig{entered: make(chan struct{}, 1), release: make(chan struct{})}
	g, socket := runGateway(t, statusSession{}, time.Hour, func(g *Gateway) {
		g.config = configv1.NewConfigServiceClient(serveFake(t, func(s *grpc.Server) { configv1.RegisterConfigServiceServer(s, cfg) }))
		g.monitor.state["config"] = &component{Status: "unreachable"}
		g.monitor.encodeLocked()
	})
	c, err := rpcclient.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Timeout = 20 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Call("config/set", map[string]any{"prop": "rpc.call_timeout_ms", "value": 2000})
		done <- err
	}()
	<-cfg.entered
	// A poll finds config serving again, while the call is in flight.
	g.monitor.mu.Lock()
	g.monitor.state["config"].Status = "serving"
	g.monitor.encodeLocked()
	g.monitor.mu.Unlock()
	// Past the wait: the call would have been cut by now.
	time.Sleep(awayStatusWait + awayStatusWait/2)
	close(cfg.release)
	if err := <-done; err != nil {
		t.Fatalf("config/set served by a config that answers again: %v", err)
	}
}
