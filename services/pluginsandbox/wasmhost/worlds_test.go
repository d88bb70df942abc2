package wasmhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Each world's import set is seed 003's: a tool has secrets but not
// config_get (its public config arrives in __config), even with
// config_read granted and a schema.
func TestToolWorldHasNoConfigImport(t *testing.T) {
	m, err := manifest.Parse([]byte(greeterManifest))
	if err != nil {
		t.Fatal(err)
	}
	h := newHost(t, wasmhost.Limits{})
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("greeter", wasmhost.WorldTool, ""), map[string]string{"greeting": "Hi", "api_key": "k"})
	tool := loadTool(t, h, "secretconfig", func(s *wasmhost.PluginSpec) {
		s.Name, s.Schema, s.Config = "greeter", m.Schema(), cfg
		s.Grants.ConfigRead = true
	})
	res, err := tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"who": "Ana"})})
	if err != nil || !res.Success {
		t.Fatalf("execute: %+v %v", res, err)
	}
	var out struct {
		Greeting  string `json:"greeting"`
		ConfigGet string `json:"config_get"`
	}
	if err := json.Unmarshal([]byte(res.Output), &out); err != nil {
		t.Fatal(err)
	}
	if out.ConfigGet != "access-denied" || out.Greeting != "Hi, Ana" {
		t.Fatalf("tool saw config_get answer %q (greeting %q)", out.ConfigGet, out.Greeting)
	}
}

// A config_read that is requested but not effectively granted validates
// the empty object: a schema with a required property fails safely,
// before any guest code runs.
func TestUngrantedConfigReadValidatesEmptyObject(t *testing.T) {
	m, err := manifest.Parse([]byte(strings.Replace(greeterManifest, "additionalProperties = false\n", "additionalProperties = false\nrequired = [\"greeting\"]\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	h := newHost(t, wasmhost.Limits{})
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("greeter", wasmhost.WorldTool, ""), map[string]string{"greeting": "Hi", "api_key": "k"})
	tool := loadTool(t, h, "secretconfig", func(s *wasmhost.PluginSpec) {
		s.Name, s.Schema, s.Config = "greeter", m.Schema(), cfg // no grant
	})
	_, err = tool.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"who": "Ana"})})
	if !errors.Is(err, wasmhost.ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
}

// A channel's operator values are materialised and validated as a whole
// before its guest code runs: a bad value refuses the call with ErrConfig
// (the guest would have answered ErrPluginFailed).
func TestChannelConfigValidatedBeforeGuestCode(t *testing.T) {
	m, err := manifest.Load(filepath.Join(repoRoot(), "plugins", "examples", "webhook"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, ""), map[string]string{"webhook_url": "http://127.0.0.1:9", "token": "t", "bogus": "x"})
	h := newHost(t, wasmhost.Limits{})
	ch := loadChannel(t, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{ConfigRead: true, HTTPClient: true}
	})
	if err := ch.Configure(context.Background(), wasmhost.CallInfo{}); !errors.Is(err, wasmhost.ErrConfig) {
		t.Fatalf("configure with an unknown property: %v, want ErrConfig", err)
	}
}
