package pluginsandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/testwait"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// fakeConfig is a config service implementing PluginValues and Live the
// way the plugin sandbox uses them.
type fakeConfig struct {
	configv1.UnimplementedConfigServiceServer
	mu     sync.Mutex
	values func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error)
	live   func() (*configv1.LiveResponse, error)
	reqs   []*configv1.PluginValuesRequest
}

func (f *fakeConfig) PluginValues(_ context.Context, req *configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return f.values(req)
}

func (f *fakeConfig) Live(context.Context, *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	return f.live()
}

func (f *fakeConfig) set(values func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values, f.reqs = values, nil
}

func (f *fakeConfig) requests() []*configv1.PluginValuesRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*configv1.PluginValuesRequest(nil), f.reqs...)
}

// serveConfig serves impl on a Unix socket and returns a client and a stop
// function (after which calls fail with Unavailable).
func serveConfig(t *testing.T, impl configv1.ConfigServiceServer) (configv1.ConfigServiceClient, func()) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "config.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	configv1.RegisterConfigServiceServer(gs, impl)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return configv1.NewConfigServiceClient(conn), gs.Stop
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConfigServiceResolve(t *testing.T) {
	fake := &fakeConfig{}
	client, stop := serveConfig(t, fake)
	src := &pluginsandbox.ConfigService{Client: client}
	ctx := context.Background()

	fake.set(func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
		return &configv1.PluginValuesResponse{
			Revision: 7,
			Config: mustStruct(t, map[string]any{
				"greeting": "Hola", "retries": 4, "ratio": 0.5, "on": true,
				"tags": []any{"urgent", "ops"}, "where": map[string]any{"region": "us-east"}, "gone": nil,
			}),
			Secrets: map[string]string{"api_key": "k-1"},
			Denied:  []string{"admin_key"},
		}, nil
	})
	rev, err := src.Resolve(ctx, "zpi1_abc")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"greeting": "Hola", "retries": "4", "ratio": "0.5", "on": "true",
		"tags": `["urgent","ops"]`, "where": `{"region":"us-east"}`, "api_key": "k-1",
	}
	if rev.Revision != "7" || !reflect.DeepEqual(rev.Values, want) || !reflect.DeepEqual(rev.Denied, []string{"admin_key"}) {
		t.Fatalf("revision = %+v", rev)
	}
	if reqs := fake.requests(); len(reqs) != 1 || reqs[0].GetPluginKey() != "zpi1_abc" {
		t.Fatalf("requests = %v", reqs)
	}

	for _, c := range []struct {
		code codes.Code
		want error
	}{
		{codes.Unimplemented, wasmhost.ErrNoConfig},
		{codes.NotFound, wasmhost.ErrNoConfig},
		{codes.Unavailable, wasmhost.ErrConfigUnavailable},
	} {
		fake.set(func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
			return nil, status.Error(c.code, "no")
		})
		if _, err := src.Resolve(ctx, "zpi1_abc"); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.code, err, c.want)
		}
	}
	fake.set(func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
		return nil, status.Error(codes.PermissionDenied, "no")
	})
	if _, err := src.Resolve(ctx, "zpi1_abc"); err == nil || errors.Is(err, wasmhost.ErrConfigUnavailable) || errors.Is(err, wasmhost.ErrNoConfig) {
		t.Errorf("PermissionDenied: err = %v", err)
	}
	// The config service gone: the transport's Unavailable.
	stop()
	if _, err := src.Resolve(ctx, "zpi1_abc"); !errors.Is(err, wasmhost.ErrConfigUnavailable) {
		t.Errorf("stopped service: err = %v", err)
	}
}

// The adapter behind a real tool: one PluginValues call per call frame
// carrying the caller's principal, public values under __config, secrets
// through secrets_get, denied keys access-denied, absent keys not-found,
// an outage a gRPC Unavailable, and a config service without PluginValues
// taken as "no config stored".
func TestConfigServiceBehindATool(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "secretconfig")
	fake := &fakeConfig{}
	client, _ := serveConfig(t, fake)
	plugins := startServer(t, dir, &pluginsandbox.ConfigService{Client: client})
	ctx := context.Background()
	principal := &commonv1.Principal{PrincipalId: "user-7"}
	execute := func(expect string) (*pluginv1.ExecuteToolResponse, error) {
		return plugins.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{
			Principal: principal, ToolName: "greeter", ArgumentsJson: `{"who":"Ana","expect":"` + expect + `"}`,
		})
	}

	fake.set(func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
		return &configv1.PluginValuesResponse{
			Revision: 3, Config: mustStruct(t, map[string]any{"greeting": "Hola", "retries": 4}),
			Secrets: map[string]string{"api_key": "s3cret"},
		}, nil
	})
	resp, err := execute("s3cret")
	if err != nil || !resp.Success {
		t.Fatalf("execute: %v, %v", resp, err)
	}
	var out struct {
		Greeting   string `json:"greeting"`
		Retries    int    `json:"retries"`
		KeyMatches bool   `json:"key_matches"`
	}
	if err := json.Unmarshal([]byte(resp.Output), &out); err != nil || out.Greeting != "Hola, Ana" || out.Retries != 4 || !out.KeyMatches {
		t.Fatalf("output %q (%v)", resp.Output, err)
	}
	reqs := fake.requests()
	if len(reqs) != 1 || reqs[0].GetPluginKey() != wasmhost.InstanceKey("greeter", wasmhost.WorldTool, "") ||
		reqs[0].GetPrincipal().GetPrincipalId() != "user-7" {
		t.Fatalf("PluginValues requests = %v (want one per call, with the tool's key and the principal)", reqs)
	}

	for _, c := range []struct {
		name string
		resp *configv1.PluginValuesResponse
		want string
	}{
		{"denied", &configv1.PluginValuesResponse{Config: mustStruct(t, map[string]any{"greeting": "Hola"}), Denied: []string{"api_key"}}, "secret: access-denied"},
		{"absent", &configv1.PluginValuesResponse{Config: mustStruct(t, map[string]any{"greeting": "Hola"})}, "secret: not-found"},
	} {
		fake.set(func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) { return c.resp, nil })
		resp, err := execute("")
		if err != nil || resp.Success || resp.Error != c.want {
			t.Errorf("%s: %v, %v; want error %q", c.name, resp, err, c.want)
		}
	}

	fake.set(func(*configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
		return nil, status.Error(codes.Unavailable, "down")
	})
	if _, err := execute(""); status.Code(err) != codes.Unavailable {
		t.Fatalf("config outage: %v, want Unavailable", err)
	}

	// A config service that does not implement PluginValues yet.
	bare, _ := serveConfig(t, &configv1.UnimplementedConfigServiceServer{})
	plugins = startServer(t, dir, &pluginsandbox.ConfigService{Client: bare})
	resp, err = execute("")
	if err != nil || resp.Success || resp.Error != "secret: not-found" {
		t.Fatalf("without PluginValues: %v, %v", resp, err)
	}
}

// A replica's settings come from the live config's plugins.*, with the
// schema's defaults for what is not set; a limit of zero is refused.
func TestSettingsFrom(t *testing.T) {
	dataDir := t.TempDir()
	doc := func(plugins map[string]any) configclient.PluginSettings {
		raw, _ := json.Marshal(map[string]any{"plugins": plugins})
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		return configclient.Snapshot{Document: m}.PluginSettings()
	}
	s, err := pluginsandbox.SettingsFrom(doc(map[string]any{"plugins_dir": "/srv/plugins",
		"limits": map[string]any{"call_timeout_ms": 300, "call_fuel": 5_000_000}}), dataDir)
	want := wasmhost.DefaultLimits()
	want.CallTimeoutMS, want.CallFuel = 300, 5_000_000
	if err != nil || s.Limits != want || s.PluginsDir != "/srv/plugins" {
		t.Fatalf("settings = %+v, %v", s, err)
	}
	s, err = pluginsandbox.SettingsFrom(doc(map[string]any{"plugins_dir": ""}), dataDir)
	if err != nil || s.Limits != wasmhost.DefaultLimits() || s.PluginsDir != filepath.Join(dataDir, "plugins") {
		t.Fatalf("defaults = %+v, %v", s, err)
	}
	if d := wasmhost.DefaultLimits(); d.CallFuel != 1_000_000_000 || d.MaxInstances != 64 || d.CallTimeoutMS != 30_000 {
		t.Fatalf("schema defaults %+v", d)
	}
	for _, bad := range []any{0, -1} {
		if _, err := pluginsandbox.SettingsFrom(doc(map[string]any{"limits": map[string]any{"max_instances": bad}}), dataDir); !errors.Is(err, pluginsandbox.ErrSettings) {
			t.Errorf("max_instances %v: err = %v", bad, err)
		}
	}
}

// hungConfig is a config service that takes PluginValues calls and never
// answers them, as a hung (SIGSTOPped) config process does, until the
// caller gives up or the test ends.
type hungConfig struct {
	configv1.UnimplementedConfigServiceServer
	calls chan struct{}
	end   chan struct{}
}

func (h *hungConfig) PluginValues(ctx context.Context, _ *configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
	h.calls <- struct{}{}
	select {
	case <-ctx.Done():
	case <-h.end:
	}
	return nil, status.Error(codes.Unavailable, "ended")
}

// A call frame's PluginValues had no bound of its own: with the config
// service hung, a plugin call that read its config waited as long as the
// caller's context (none, for a channel's poll) or the connection's
// keepalive, where every other per-request config call gives up after
// configclient.CallTimeout. It now gives up then too, saying the config
// service did not answer.
func TestConfigServiceResolveWhileConfigIsHung(t *testing.T) {
	h := &hungConfig{calls: make(chan struct{}, 1), end: make(chan struct{})}
	t.Cleanup(func() { close(h.end) })
	client, _ := serveConfig(t, h)
	src := &pluginsandbox.ConfigService{Client: client}
	done := make(chan error, 1)
	go func() {
		_, err := src.Resolve(context.Background(), "zpi1_abc")
		done <- err
	}()
	testwait.Recv(t, h.calls)
	err := testwait.Recv(t, done)
	// Bounded, and saying so in every ordering: at load, the server's
	// own deadline (taken from ours) once ended the call Unavailable
	// before the bound's timer had fired, and the error named no
	// missing answer.
	if !errors.Is(err, wasmhost.ErrConfigUnavailable) || !errors.Is(err, configclient.ErrConfigNoAnswer) {
		t.Fatalf("Resolve with the config service hung: %v, want unavailable, the config service's answer missing", err)
	}
	t.Logf("Resolve with the config service hung: %v", err)
}

// edgeConfig is a config service that fails PluginValues a moment before
// the deadline the caller sent it, as its own timer may at load: its
// error reaches the caller before the caller's bound has fired.
type edgeConfig struct {
	configv1.UnimplementedConfigServiceServer
}

func (edgeConfig) PluginValues(ctx context.Context, _ *configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "no deadline sent")
	}
	select {
	case <-time.After(time.Until(dl) - 5*time.Millisecond):
	case <-ctx.Done():
	}
	return nil, status.Error(codes.Unavailable, "ended at the deadline's edge")
}

// The ordering the hung test met once at load, made every time: the
// call's error comes before the bound's timer has fired. It was
// answered "config service: Unavailable", naming no missing answer; it
// now says the config service did not answer within the bound.
func TestConfigServiceResolveEndedAtTheBoundsEdge(t *testing.T) {
	client, _ := serveConfig(t, edgeConfig{})
	src := &pluginsandbox.ConfigService{Client: client}
	_, err := src.Resolve(context.Background(), "zpi1_abc")
	if !errors.Is(err, wasmhost.ErrConfigUnavailable) || !errors.Is(err, configclient.ErrConfigNoAnswer) {
		t.Fatalf("Resolve failed at its bound's edge: %v, want unavailable, the config service's answer missing", err)
	}
}
