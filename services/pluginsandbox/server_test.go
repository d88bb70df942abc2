package pluginsandbox_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// installExample builds plugins/examples/<name> into dir/<name>/plugin.wasm
// next to a copy of its manifest, as an installed plugin looks.
func installExample(t *testing.T, dir, name string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dst := filepath.Join(dir, name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(dst, "plugin.wasm"), "./plugins/examples/"+name)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	m, err := os.ReadFile(filepath.Join(root, "plugins", "examples", name, "manifest.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "manifest.toml"), m, 0o644); err != nil {
		t.Fatal(err)
	}
}

func startServer(t *testing.T, pluginsDir string) pluginv1.PluginServiceClient {
	t.Helper()
	ctx := context.Background()
	host, err := wasmhost.New(ctx, wasmhost.Config{CacheDir: t.TempDir(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	srv, err := pluginsandbox.NewServer(ctx, pluginsandbox.Config{Host: host, PluginsDir: pluginsDir, Logger: zap.NewNop(), ConfigSource: &wasmhost.MemoryConfig{}})
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
	client := startServer(t, dir)
	ctx := context.Background()

	tools, err := client.ListTools(ctx, &pluginv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 2 || tools.Tools[0].Name != "echo" || tools.Tools[0].ParametersSchemaJson == "" {
		t.Fatalf("tools = %v", tools.Tools)
	}
	plugins, err := client.ListPlugins(ctx, &pluginv1.ListPluginsRequest{})
	if err != nil || len(plugins.Plugins) != 2 {
		t.Fatalf("plugins = %v, %v", plugins, err)
	}

	resp, err := client.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{
		Principal: &configv1.Principal{PrincipalId: "shared-operator", Operator: true},
		ToolName:  "echo", ArgumentsJson: `{"text":"over grpc"}`, ToolCallId: "call-1",
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
	_, err = client.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "echo", ArgumentsJson: "{"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad json: %v", err)
	}
}
