package wasmhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

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

func TestLimitsMustBeNonZero(t *testing.T) {
	base := wasmhost.DefaultLimits()
	for _, zero := range []func(*wasmhost.Limits){
		func(l *wasmhost.Limits) { l.CallFuel = 0 },
		func(l *wasmhost.Limits) { l.CallTimeoutMS = 0 },
		func(l *wasmhost.Limits) { l.MaxMemoryMB = 0 },
		func(l *wasmhost.Limits) { l.MaxTableElements = 0 },
		func(l *wasmhost.Limits) { l.MaxInstances = 0 },
	} {
		l := base
		zero(&l)
		if _, err := wasmhost.New(context.Background(), wasmhost.Config{Limits: l}); !errors.Is(err, wasmhost.ErrInvalidLimits) {
			t.Errorf("limits %+v: err = %v, want ErrInvalidLimits", l, err)
		}
	}
}
