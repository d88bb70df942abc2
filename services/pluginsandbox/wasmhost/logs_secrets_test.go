package wasmhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// slowSink holds every write for a moment, so a flood outruns the drain.
type slowSink struct{ recordingSink }

func (s *slowSink) WritePluginLog(r wasmhost.LogRecord) {
	if len(r.Message) > 1<<10 {
		time.Sleep(5 * time.Millisecond)
	}
	s.recordingSink.WritePluginLog(r)
}

func TestLogFloodDropsAreCounted(t *testing.T) {
	sink := &slowSink{}
	h := newHost(t, wasmhost.Limits{CallFuel: 1 << 40}, func(c *wasmhost.Config) { c.LogSink = sink })
	bad := loadTool(t, h, "misbehave")

	// 400 records of 48 KiB (19 MiB) against an 8 MiB budget and a sink
	// that writes one record per 5 ms.
	const n, size = 400, 48 << 10
	res, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "logflood", "n": n, "size": size})})
	if err != nil || !res.Success {
		t.Fatalf("logflood: %+v, %v", res, err)
	}
	// Records over 64 KiB are dropped whole.
	if _, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "logflood", "n": 10, "size": 70 << 10})}); err != nil {
		t.Fatal(err)
	}
	// Past the per-frame host-call budget, logging does nothing (and counts).
	if _, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "logflood", "n": wasmhost.MaxHostCallsPerFrame + 100, "size": 10})}); err != nil {
		t.Fatal(err)
	}
	total := uint64(n + 10 + wasmhost.MaxHostCallsPerFrame + 100)
	var st wasmhost.LogStats
	deadline := time.Now().Add(20 * time.Second)
	for {
		st = h.LogStats()
		if st.Written+st.Dropped == total || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Written+st.Dropped != total {
		t.Fatalf("written %d + dropped %d != sent %d", st.Written, st.Dropped, total)
	}
	if got := uint64(len(sink.all())); got != st.Written {
		t.Fatalf("sink saw %d records, stats say %d written", got, st.Written)
	}
	if st.Dropped < 10+100 || st.Written == 0 {
		t.Fatalf("stats %+v: expected drops and writes", st)
	}
	if st.HighWater > wasmhost.LogBudgetBytes {
		t.Fatalf("queued bytes peaked at %d, budget %d", st.HighWater, wasmhost.LogBudgetBytes)
	}
	t.Logf("written %d, dropped %d, high water %d bytes", st.Written, st.Dropped, st.HighWater)
}

const greeterManifest = `
name = "greeter"
version = "0.1.0"
wasm_path = "plugin.wasm"
capabilities = ["tool"]
permissions = ["config_read"]

[config_schema]
type = "object"
additionalProperties = false
[config_schema.properties.greeting]
type = "string"
[config_schema.properties.retries]
type = "integer"
minimum = 0
[config_schema.properties.api_key]
type = "string"
x-secret = true
`

func TestSecretsReachExecuteOnly(t *testing.T) {
	const secret = "s3cr3t-VALUE-4242"
	m, err := manifest.Parse([]byte(greeterManifest))
	if err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{}
	h := newHost(t, wasmhost.Limits{}, func(c *wasmhost.Config) { c.LogSink = sink })
	cfg := &wasmhost.MemoryConfig{}
	key := wasmhost.InstanceKey("greeter", wasmhost.WorldTool, "")
	cfg.Set(key, map[string]string{"greeting": "Hola", "retries": "4", "api_key": secret})
	tool := loadTool(t, h, "secretconfig", func(s *wasmhost.PluginSpec) {
		s.Name = "greeter"
		s.Schema = m.Schema()
		s.Grants.ConfigRead = true
		s.Config = cfg
	})

	// A caller-supplied __config is replaced by the host's.
	res, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{
		"who": "Ana", "expect": secret, "__config": map[string]any{"greeting": "forged", "api_key": "forged"},
	})})
	if err != nil || !res.Success {
		t.Fatalf("execute: %+v, %v", res, err)
	}
	var out struct {
		Greeting   string   `json:"greeting"`
		Retries    int      `json:"retries"`
		KeyLen     int      `json:"key_len"`
		KeyMatches bool     `json:"key_matches"`
		ConfigKeys []string `json:"config_keys"`
	}
	if err := json.Unmarshal([]byte(res.Output), &out); err != nil {
		t.Fatalf("output %q: %v", res.Output, err)
	}
	if out.Greeting != "Hola, Ana" || out.Retries != 4 || !out.KeyMatches || out.KeyLen != len(secret) {
		t.Fatalf("output = %+v", out)
	}
	for _, k := range out.ConfigKeys {
		if k == "api_key" {
			t.Fatal("the secret appeared in __config")
		}
	}

	// Invalid config: refused before guest code runs, without the value.
	cfg.Set(key, map[string]string{"greeting": "Hola", "retries": "-1", "api_key": secret})
	_, err = tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"who": "Ana"})})
	if !errors.Is(err, wasmhost.ErrConfig) || strings.Contains(err.Error(), secret) {
		t.Fatalf("invalid config: err = %v", err)
	}
	// Resolver outage: refused, no detail.
	cfg.Set(key, map[string]string{"greeting": "Hola", "api_key": secret})
	cfg.Fail = errors.New("config service down")
	if _, err = tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"who": "Ana"})}); !errors.Is(err, wasmhost.ErrConfig) {
		t.Fatalf("outage: err = %v", err)
	}
	cfg.Fail = nil

	// Not granted: the empty object validates, secrets.get is access-denied.
	denied := loadTool(t, h, "secretconfig", func(s *wasmhost.PluginSpec) {
		s.Name = "greeter"
		s.Schema = m.Schema()
		s.Config = cfg
	})
	res, err = denied.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"who": "Ana"})})
	if err != nil || res.Success || res.Error == nil || *res.Error != "secret: access-denied" {
		t.Fatalf("not granted: %+v, %v", res, err)
	}

	time.Sleep(50 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.all()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(sink.all()) == 0 {
		t.Fatal("no plugin log written")
	}
	for _, r := range sink.all() {
		if strings.Contains(r.Message, secret) || strings.Contains(r.Plugin, secret) {
			t.Fatalf("secret in log record %+v", r)
		}
	}
}
