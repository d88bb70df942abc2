package wasmhost_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// The observer world: events reach the plugin, which may only log.
func TestObserverReceivesEvents(t *testing.T) {
	sink := &recordingSink{}
	h := newHost(t, wasmhost.Limits{}, func(c *wasmhost.Config) { c.LogSink = sink })
	o, err := h.LoadObserver(context.Background(), wasmhost.PluginSpec{Name: "tally", Version: "0.1.0", Wasm: guest(t, "observer")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close(context.Background()) })
	if o.Name() != "tally" {
		t.Fatalf("name %q", o.Name())
	}
	for i := 0; i < 2; i++ {
		if err := o.RecordEvent(context.Background(), wasmhost.ObserverEvent{Kind: abi.ObserverToolCall, Timestamp: 1, Fields: map[string]string{"tool": "wasm_echo"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var msgs []string
		for _, r := range sink.all() {
			msgs = append(msgs, r.Message)
		}
		joined := strings.Join(msgs, "\n")
		if strings.Contains(joined, "event tool_call #2 tool=wasm_echo") && strings.Contains(joined, "flush map[tool_call:2]") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("observer logs: %q", msgs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
