package session

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// sandbox is a plugin sandbox over real gRPC with two tools: shout works,
// broken fails the way a trapped guest does, crash the way a refused
// call does.
type sandbox struct {
	pluginv1.UnimplementedPluginServiceServer
}

func (sandbox) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	return &pluginv1.ListToolsResponse{Tools: []*pluginv1.Tool{
		{Name: "shout", Description: "upper-cases", ParametersSchemaJson: `{"type":"object"}`, PluginKey: "p"},
		{Name: "broken", PluginKey: "p"},
		{Name: "crash", PluginKey: "p"},
		{Name: "echo", Description: "a plugin may not shadow a built-in", PluginKey: "p"},
	}}, nil
}

func (sandbox) ExecuteTool(_ context.Context, req *pluginv1.ExecuteToolRequest) (*pluginv1.ExecuteToolResponse, error) {
	switch req.GetToolName() {
	case "shout":
		return &pluginv1.ExecuteToolResponse{Success: true, Output: strings.ToUpper(req.GetArgumentsJson()) + " by " + req.GetPrincipal().GetPrincipalId()}, nil
	case "broken":
		return &pluginv1.ExecuteToolResponse{Success: false, Error: "fuel exhausted"}, nil
	case "echo":
		return &pluginv1.ExecuteToolResponse{Success: true, Output: "the plugin's echo ran"}, nil
	}
	return nil, status.Error(codes.ResourceExhausted, "the plugin sandbox is running its maximum number of instances; retry later")
}

func serveSandbox(t *testing.T, impl pluginv1.PluginServiceServer) string {
	sock := filepath.Join(t.TempDir(), "plugin.sock")
	gs := grpcserver.New(testenv.Logger(t), 0)
	if impl != nil {
		pluginv1.RegisterPluginServiceServer(gs.GRPC, impl)
	}
	lis, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gs.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

func pluginClient(t *testing.T, addr string) pluginv1.PluginServiceClient {
	cc, err := grpcclient.Dial(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pluginv1.NewPluginServiceClient(cc)
}

// Plugin tools run through the sandbox; their failures are failed
// results, never failed turns; a built-in keeps its name.
func TestPluginTools(t *testing.T) {
	client := pluginClient(t, serveSandbox(t, sandbox{}))
	h := newHarness(t, func(c *Config) { c.Plugins = client })
	id := h.newSession(alice, "default")
	rec := h.record(id)
	resp := h.prompt(alice, id, "/tool shout {\"a\":\"b\"}\n/tool broken\n/tool crash\n/tool echo {\"e\":1}\n/say end")
	if resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || resp.GetContent() != "end" {
		t.Fatalf("prompt %v", resp)
	}
	var results []update
	all := rec.until(UpdateTurnComplete)
	for _, u := range all {
		if u.Type == UpdateToolResult {
			results = append(results, u)
		}
	}
	if told := texts(all, UpdateThoughtChunk); len(told) != 0 {
		t.Fatalf("a turn that listed the plugin tools was told it had none: %q", told)
	}
	want := []struct{ status, output string }{
		{toolCompleted, `{"A":"B"} by user:alice`},
		{toolFailed, "Tool broken failed: fuel exhausted"},
		{toolFailed, "Tool crash failed: the plugin sandbox is running its maximum number of instances; retry later"},
		{toolCompleted, `{"e":1}`},
	}
	if len(results) != len(want) {
		t.Fatalf("results %v", results)
	}
	for i, w := range want {
		if results[i].str("status") != w.status || results[i].str("raw_output") != w.output {
			t.Fatalf("result %d: %v, want %+v", i, results[i].Params, w)
		}
	}
}

// A sandbox that is not there yet, or does not implement the service,
// means no plugin tools: built-ins still work, and the turn's first
// update, a thought, says that it has none and why (it said nothing
// before). Through DialReplicas (the service's own client) the listing
// waits for a replica that serves within its bound (an hour here), but
// not for a sandbox gone for good: once no replica has connected for
// grpcclient.RestartGrace the listing fails and the turn starts.
func TestPluginSandboxMissing(t *testing.T) {
	gone := filepath.Join(t.TempDir(), "nobody.sock")
	for name, dial := range map[string]func(*testing.T) pluginv1.PluginServiceClient{
		"unavailable":   func(t *testing.T) pluginv1.PluginServiceClient { return pluginClient(t, gone) },
		"unimplemented": func(t *testing.T) pluginv1.PluginServiceClient { return pluginClient(t, serveSandbox(t, nil)) },
		"gone, dialled as replicas": func(t *testing.T) pluginv1.PluginServiceClient {
			cc, err := grpcclient.DialReplicas(gone + "," + gone + ".1")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			return pluginv1.NewPluginServiceClient(cc)
		},
	} {
		t.Run(name, func(t *testing.T) {
			client := dial(t)
			h := newHarness(t, func(c *Config) { c.Plugins = client; c.PluginListTimeout = time.Hour })
			id := h.newSession(alice, "default")
			rec := h.record(id)
			resp := h.prompt(alice, id, "/tool shout {}\n/tool echo {\"ok\":true}\n/say end")
			if resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || resp.GetContent() != "end" {
				t.Fatalf("prompt %v", resp)
			}
			all := rec.until(UpdateTurnComplete)
			if told := texts(all, UpdateThoughtChunk); len(told) != 1 || all[0].Type != UpdateThoughtChunk ||
				!strings.HasPrefix(told[0], "[No plugin tools in this turn: the plugin sandbox could not list them: ") {
				t.Fatalf("the turn without plugin tools was not told so first: %s %q", types(all), told)
			}
			t.Logf("told %q", texts(all, UpdateThoughtChunk)[0])
			var rows []string
			r, err := h.pool.Query(context.Background(), "SELECT name || '=' || status FROM tool_calls WHERE session_id = $1 ORDER BY name DESC", id)
			if err != nil {
				t.Fatal(err)
			}
			for r.Next() {
				var s string
				_ = r.Scan(&s)
				rows = append(rows, s)
			}
			if strings.Join(rows, ",") != "shout=failed,echo=completed" {
				t.Fatalf("tool calls %v", rows)
			}
		})
	}
}

// floodSandbox's one tool answers 2 MiB: cut to the request's
// output_limit as the real sandbox cuts it
// (TestToolOutputSentOnlyAsFarAsItIsShown), or whole when old, as a
// sandbox older than the field.
type floodSandbox struct {
	pluginv1.UnimplementedPluginServiceServer
	old    bool
	limits chan int32
}

const floodOutput = "é"

func (floodSandbox) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	return &pluginv1.ListToolsResponse{Tools: []*pluginv1.Tool{{Name: "flood", ParametersSchemaJson: `{"type":"object"}`, PluginKey: "p"}}}, nil
}

func (f floodSandbox) ExecuteTool(_ context.Context, req *pluginv1.ExecuteToolRequest) (*pluginv1.ExecuteToolResponse, error) {
	select {
	case f.limits <- req.GetOutputLimit():
	default:
	}
	out := strings.Repeat(floodOutput, 1<<20)
	resp := &pluginv1.ExecuteToolResponse{Success: true, Output: out}
	if limit := int(req.GetOutputLimit()); limit > 0 && !f.old {
		resp.Output, resp.OutputBytes = tooloutput.Start(out, limit), int64(len(out))
	}
	return resp, nil
}

// The session service sends the room it shows with a plugin tool call
// (output_limit): the client sees the same cut, output_bytes and note
// from a sandbox that sends only that start as from one that sends the
// whole output (the fifty-seventh round).
func TestPluginToolOutputShownTheSameCutOrWhole(t *testing.T) {
	var shown []string
	for _, old := range []bool{false, true} {
		sb := floodSandbox{old: old, limits: make(chan int32, 1)}
		h := newHarness(t, func(c *Config) { c.Plugins = pluginClient(t, serveSandbox(t, sb)) })
		id := h.newSession(alice, "default")
		rec := h.record(id)
		if resp := h.prompt(alice, id, "/tool flood\n/say end"); resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
			t.Fatalf("prompt %v", resp)
		}
		if got := <-sb.limits; got != MaxLiveToolOutputBytes {
			t.Fatalf("the call's output_limit %d, want %d", got, MaxLiveToolOutputBytes)
		}
		for _, u := range rec.until(UpdateTurnComplete) {
			if u.Type == UpdateToolResult {
				bytes, _ := u.Params["output_bytes"].(float64)
				shown = append(shown, fmt.Sprintf("%d %s", int(bytes), u.str("raw_output")))
			}
		}
	}
	wantNote := fmt.Sprintf(" of %d bytes shown]", 2<<20)
	if len(shown) != 2 || shown[0] != shown[1] || !strings.HasPrefix(shown[0], fmt.Sprint(2<<20)+" ") || !strings.HasSuffix(shown[0], wantNote) {
		t.Fatalf("the results differ or miss the whole's size: %d results", len(shown))
	}
}
