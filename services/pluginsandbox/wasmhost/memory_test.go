package wasmhost_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

func loadMemory(tb testing.TB, h *wasmhost.Host, name string, mut ...func(*wasmhost.PluginSpec)) *wasmhost.Memory {
	tb.Helper()
	spec := wasmhost.PluginSpec{Name: name, Version: "0.1.0", Wasm: guest(tb, name)}
	for _, m := range mut {
		m(&spec)
	}
	mem, err := h.LoadMemory(context.Background(), spec)
	if err != nil {
		tb.Fatalf("load memory %s: %v", name, err)
	}
	tb.Cleanup(func() { _ = mem.Close(context.Background()) })
	return mem
}

// A memory plugin keeps one instance across calls; a trap leaves it
// unavailable (never resumed) until its owner rebuilds it, empty.
func TestMemoryStoreRecallForgetAndRebuild(t *testing.T) {
	h := newHost(t, wasmhost.Limits{CallFuel: 100_000_000})
	mem := loadMemory(t, h, "misbehave")
	ctx := context.Background()
	if mem.Name() != "misbehave" || !mem.Capabilities().Count {
		t.Fatalf("metadata = %q %+v", mem.Name(), mem.Capabilities())
	}
	for i, c := range []string{"red apple", "green apple", "blue sky"} {
		if err := mem.Store(ctx, wasmhost.MemoryEntry{Key: fmt.Sprint("k", i), Content: c, Category: "core"}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := mem.Recall(ctx, "apple", 10)
	if err != nil || len(got) != 2 || got[0].Key != "k0" || got[1].Content != "green apple" || got[0].Category != "core" {
		t.Fatalf("recall = %+v, %v", got, err)
	}
	if got, err := mem.Recall(ctx, "apple", 1); err != nil || len(got) != 1 {
		t.Fatalf("recall limit 1 = %+v, %v", got, err)
	}
	if ok, err := mem.Forget(ctx, "k1"); err != nil || !ok {
		t.Fatalf("forget = %v, %v", ok, err)
	}
	if ok, err := mem.Forget(ctx, "k1"); err != nil || ok {
		t.Fatalf("forget twice = %v, %v", ok, err)
	}
	if n, err := mem.Count(ctx); err != nil || n != 2 {
		t.Fatalf("count = %d, %v", n, err)
	}

	inUse := h.InstancesInUse()
	if err := mem.Store(ctx, wasmhost.MemoryEntry{Key: "x", Content: "panic"}); !errors.Is(err, wasmhost.ErrTrap) {
		t.Fatalf("panic: %v", err)
	}
	if _, err := mem.Count(ctx); !errors.Is(err, wasmhost.ErrUnavailable) {
		t.Fatalf("after a trap: %v, want ErrUnavailable", err)
	}
	if err := mem.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := mem.Count(ctx); err != nil || n != 0 {
		t.Fatalf("count after rebuild = %d, %v", n, err)
	}
	if err := mem.Store(ctx, wasmhost.MemoryEntry{Key: "k", Content: "loop"}); !errors.Is(err, wasmhost.ErrFuelExhausted) {
		t.Fatalf("loop: %v", err)
	}
	if err := mem.Rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mem.Store(ctx, wasmhost.MemoryEntry{Key: "k", Content: "v"}); err != nil {
		t.Fatal(err)
	}
	waitInstances(t, h, inUse)
}

// The memory adapter never binds outbound HTTP, config or secrets, even
// when the grants are there; the same grant gives a tool the network.
func TestMemoryHasNoHTTPNorConfig(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "hi")
	}))
	t.Cleanup(srv.Close)
	m, err := manifest.Parse([]byte(greeterManifest))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("misbehave", wasmhost.WorldMemory, ""), map[string]string{"greeting": "hola", "api_key": "k"})
	h := newHost(t, wasmhost.Limits{})
	mem := loadMemory(t, h, "misbehave", func(s *wasmhost.PluginSpec) {
		s.Grants = wasmhost.Grants{HTTPClient: true, ConfigRead: true}
		s.Schema, s.Config = m.Schema(), cfg
	})
	ctx := context.Background()
	for content, want := range map[string]string{
		"fetch:" + srv.URL: "fetch: access-denied",
		"secret":           "secret: access-denied",
		"config":           "config: access-denied",
	} {
		err := mem.Store(ctx, wasmhost.MemoryEntry{Key: "k", Content: content})
		if !errors.Is(err, wasmhost.ErrPluginFailed) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", content, err, want)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the memory plugin reached the network %d times", n)
	}

	fetch := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	res, err := fetch.Execute(ctx, wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})})
	if err != nil || !res.Success || hits.Load() != 1 {
		t.Fatalf("tool with the same grant: %+v, %v, %d hits", res, err, hits.Load())
	}
}
