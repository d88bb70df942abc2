package pluginsandbox_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// startServer serves the plugins of pluginsDir over gRPC; source nil means
// an empty in-memory config.
func startServer(t *testing.T, pluginsDir string, source wasmhost.ConfigSource) pluginv1.PluginServiceClient {
	t.Helper()
	ctx := context.Background()
	host, err := wasmhost.New(ctx, wasmhost.Config{CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	if source == nil {
		source = &wasmhost.MemoryConfig{}
	}
	srv, err := pluginsandbox.NewServer(ctx, pluginsandbox.Config{Host: host, PluginsDir: pluginsDir, Logger: zap.NewNop(), ConfigSource: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(ctx) })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pluginv1.RegisterPluginServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginv1.NewPluginServiceClient(conn)
}

func TestServerListsAndExecutesTools(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "echo")
	installExample(t, dir, "misbehave")
	// A broken plugin is skipped, not fatal.
	if err := os.MkdirAll(filepath.Join(dir, "broken"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken", "manifest.toml"), []byte("name = 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	client := startServer(t, dir, nil)
	ctx := context.Background()

	tools, err := client.ListTools(ctx, &pluginv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 2 || tools.Tools[0].Name != "misbehave" || tools.Tools[1].Name != "wasm_echo" || tools.Tools[1].ParametersSchemaJson == "" {
		t.Fatalf("tools = %v", tools.Tools)
	}
	// A listing past its bound leaves the rest out rather than fail: one
	// plugin's large metadata hid every tool.
	undo := pluginsandbox.SetListBudget(int(proto.Size(tools.Tools[0])) + 8)
	short, err := client.ListTools(ctx, &pluginv1.ListToolsRequest{})
	undo()
	if err != nil || len(short.Tools) != 1 || short.Tools[0].Name != "misbehave" {
		t.Fatalf("a listing past its bound: %v, %v", short, err)
	}
	plugins, err := client.ListPlugins(ctx, &pluginv1.ListPluginsRequest{})
	if err != nil || len(plugins.Plugins) != 2 {
		t.Fatalf("plugins = %v, %v", plugins, err)
	}

	resp, err := client.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{
		Principal: &commonv1.Principal{PrincipalId: "shared-operator", Operator: true},
		ToolName:  "wasm_echo", ArgumentsJson: `{"text":"over grpc"}`, ToolCallId: "call-1",
	})
	if err != nil || !resp.Success || resp.Output != "over grpc" || resp.FuelUsed <= 0 {
		t.Fatalf("execute echo: %v, %v", resp, err)
	}

	resp, err = client.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "misbehave", ArgumentsJson: `{"mode":"panic"}`})
	if err != nil || resp.Success || resp.Error == "" {
		t.Fatalf("execute misbehave: %v, %v", resp, err)
	}

	_, err = client.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown tool: %v", err)
	}
	_, err = client.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "wasm_echo", ArgumentsJson: "{"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad json: %v", err)
	}
}
