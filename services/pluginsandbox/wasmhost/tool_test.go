package wasmhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

func TestEchoToolEndToEnd(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	tool := loadTool(t, h, "echo")
	if tool.Name() != "wasm_echo" || tool.Description() == "" {
		t.Fatalf("metadata = %q, %q", tool.Name(), tool.Description())
	}
	var schema map[string]any
	if err := json.Unmarshal(tool.ParametersSchema(), &schema); err != nil || schema["type"] != "object" {
		t.Fatalf("schema = %s (%v)", tool.ParametersSchema(), err)
	}
	for i := 0; i < 5; i++ {
		res, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: json.RawMessage(`{"text":"hello"}`)})
		if err != nil {
			t.Fatalf("execute: %v", err)
		}
		if !res.Success || res.Output != "hello" {
			t.Fatalf("result = %+v", res)
		}
	}
	if _, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: json.RawMessage(`[1]`)}); !errors.Is(err, wasmhost.ErrABI) {
		t.Fatalf("array arguments: err = %v", err)
	}
}

// A Go guest writes its result envelope by hand (abi.ToolEnvelope's
// AppendJSON): what a tool returns on each of its three ways out, text
// that needs every kind of escape included, reaches the host as returned.
func TestToolResultEnvelopeEndToEnd(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	echo := loadTool(t, h, "echo")
	bad := loadTool(t, h, "misbehave")
	texts := []string{"", "plain", "quote \" backslash \\ <tag> & amp", "ctl \b\f\n\r\t\u0000\u001f", "é 日本 🙂 \u2028 \u2029"}
	ctx := context.Background()
	for _, text := range texts {
		call := func(tool *wasmhost.Tool, a map[string]string) wasmhost.ToolResult {
			t.Helper()
			res, err := tool.Execute(ctx, wasmhost.ToolCall{Args: args(a)})
			if err != nil {
				t.Fatalf("%s %v: %v", tool.Name(), a, err)
			}
			return res
		}
		if res := call(echo, map[string]string{"text": text}); !res.Success || res.Output != text || res.Error != nil {
			t.Errorf("echo %q: %+v", text, res)
		}
		if res := call(bad, map[string]string{"mode": "refuse", "text": text}); res.Success || res.Output != text || res.Error == nil || *res.Error != text {
			t.Errorf("refuse %q: %+v", text, res)
		}
		if res := call(bad, map[string]string{"mode": "fail", "text": text}); res.Success || res.Output != "" || res.Error == nil || *res.Error != text {
			t.Errorf("fail %q: %+v", text, res)
		}
	}
}

func TestLimitsMustBeNonZero(t *testing.T) {
	base := wasmhost.DefaultLimits()
	for _, zero := range []func(*wasmhost.Limits){
		func(l *wasmhost.Limits) { l.CallFuel = 0 },
		func(l *wasmhost.Limits) { l.CallTimeoutMS = 0 },
		func(l *wasmhost.Limits) { l.MaxMemoryMB = 0 },
		func(l *wasmhost.Limits) { l.MaxTableElements = 0 },
		func(l *wasmhost.Limits) { l.MaxInstances = 0 },
		func(l *wasmhost.Limits) { l.MaxTotalMemoryMB = 0 },
	} {
		l := base
		zero(&l)
		if _, err := wasmhost.New(context.Background(), wasmhost.Config{Limits: l}); !errors.Is(err, wasmhost.ErrInvalidLimits) {
			t.Errorf("limits %+v: err = %v, want ErrInvalidLimits", l, err)
		}
	}
}

// Every tool call runs in an instance no earlier call touched: the guest
// counts its calls in a global, and each call sees only itself. Paced calls
// take pre-instantiated instances from the pool; back-to-back calls drain
// it and instantiate on the caller's path; both must be fresh.
func TestEachToolCallGetsAFreshInstance(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	tool := loadTool(t, h, "misbehave")
	call := wasmhost.ToolCall{Args: json.RawMessage(`{"mode":"calls"}`)}
	for _, paced := range []bool{true, false} {
		for i := 0; i < 6; i++ {
			if paced {
				waitPoolFull(t, h, tool)
			}
			res, err := tool.Execute(context.Background(), call)
			if err != nil || !res.Success {
				t.Fatalf("paced %v, call %d: %+v, %v", paced, i, res, err)
			}
			if res.Output != "1" {
				t.Fatalf("paced %v, call %d: the instance had run %s calls, want 1 (a fresh instance)", paced, i, res.Output)
			}
		}
	}
}

// waitPoolFull polls until the host holds exactly the tool's pool of
// pre-instantiated instances (the default PoolSize, 2) and nothing else.
func waitPoolFull(t *testing.T, h *wasmhost.Host, _ *wasmhost.Tool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.InstancesInUse() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("pool not refilled: %d instances in use, want 2", h.InstancesInUse())
		}
		time.Sleep(time.Millisecond)
	}
}

// Used instances are closed off the callers' path by the host's reaper;
// Close waits for it, so once Close has returned and the calls racing it
// have ended, no instance is left: used, pooled or queued for closing.
func TestCloseWaitsForInstanceTeardown(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	echo := loadTool(t, h, "echo")
	const callers = 4
	var wg sync.WaitGroup
	var served atomic.Int64
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := echo.Execute(context.Background(), wasmhost.ToolCall{Args: json.RawMessage(`{"text":"x"}`)})
				if errors.Is(err, wasmhost.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("execute: %v", err)
					return
				}
				served.Add(1)
			}
		}()
	}
	for deadline := time.Now().Add(30 * time.Second); served.Load() < 20; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d calls served", served.Load())
		}
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := h.InstancesInUse(); n != 0 {
		t.Fatalf("%d instances left after Close, want 0", n)
	}
}

// A tool's name, description and schema were read up to 16 MiB each, and
// every tool goes into one listing that gRPC caps at 16 MiB: one tool with
// a 16 MiB schema made the sandbox's listing fail, and the session service
// saw no plugin tool at all. A tool past the bounds does not load.
func TestToolMetadataBounded(t *testing.T) {
	h := newHost(t, wasmhost.Limits{})
	for _, c := range []struct{ method, body, want string }{
		{"ParametersSchema() json.RawMessage", "return json.RawMessage(`{\"type\":\"object\",\"description\":\"` + strings.Repeat(\"A\", 70000) + `\"}`)", "tool_parameters_schema is 70034 bytes; the limit is 65536"},
		{"Description() string", "return strings.Repeat(\"d\", 20000)", "tool_description is 20000 bytes; the limit is 16384"},
		{"Name() string", "return strings.Repeat(\"n\", 65)", "tool_name is 65 bytes; the limit is 64"},
	} {
		src := "//go:build wasip1\n\npackage main\n\nimport (\n\t\"encoding/json\"\n\t\"strings\"\n\n\t\"github.com/clawmesh/clawmesh/plugins/pdk/tool\"\n)\n\n" +
			"var _ = json.Valid\nvar _ = strings.Repeat\n\ntype big struct{ echo }\n\nfunc (big) " + c.method + " { " + c.body + " }\n\n" +
			"func init() { tool.Register(big{}) } // after main.go's init\n"
		wasm := guestWith(t, "echo", "zz_big.go", src)
		_, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "echo", Version: "0.1.0", Wasm: wasm})
		if !errors.Is(err, wasmhost.ErrABI) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want %q", c.method, err, c.want)
		}
	}
	// At the bounds, a tool loads.
	loadTool(t, h, "echo")
}
