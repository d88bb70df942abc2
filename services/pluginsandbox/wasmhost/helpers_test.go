package wasmhost_test

import (
	"context"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Guests are built from source once per test binary (internal/guestbuild);
// hosts share the suite's compilation cache (guestbuild.CompileCacheDir),
// so each module is compiled once, whichever package compiles it first.
var cacheDir string

func TestMain(m *testing.M) {
	var err error
	if cacheDir, err = guestbuild.CompileCacheDir(); err != nil {
		panic(err)
	}
	code := m.Run()
	guestbuild.Cleanup()
	os.Exit(code)
}

func repoRoot() string { return guestbuild.Root() }

// guest returns the wasm of plugins/examples/<name>, building it on first use.
func guest(tb testing.TB, name string) []byte {
	tb.Helper()
	path, err := guestbuild.Wasm(name)
	return readBuilt(tb, path, err)
}

// guestWith is guest's example built with one more source file (see
// guestbuild.WasmWith).
func guestWith(tb testing.TB, name, file, src string) []byte {
	tb.Helper()
	path, err := guestbuild.WasmWith(name, file, src)
	return readBuilt(tb, path, err)
}

// readBuilt reads the module a guestbuild call built at path.
func readBuilt(tb testing.TB, path string, err error) []byte {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return wasm
}

// newHost starts a host with the shared cache; zero limit fields take the
// defaults.
func newHost(tb testing.TB, lim wasmhost.Limits, mut ...func(*wasmhost.Config)) *wasmhost.Host {
	tb.Helper()
	def := wasmhost.DefaultLimits()
	if lim.CallFuel == 0 {
		lim.CallFuel = def.CallFuel
	}
	if lim.CallTimeoutMS == 0 {
		lim.CallTimeoutMS = def.CallTimeoutMS
	}
	if lim.MaxMemoryMB == 0 {
		lim.MaxMemoryMB = def.MaxMemoryMB
	}
	if lim.MaxTableElements == 0 {
		lim.MaxTableElements = def.MaxTableElements
	}
	if lim.MaxInstances == 0 {
		lim.MaxInstances = def.MaxInstances
	}
	if lim.MaxTotalMemoryMB == 0 {
		lim.MaxTotalMemoryMB = def.MaxTotalMemoryMB
	}
	cfg := wasmhost.Config{Limits: lim, CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes}
	// The tests' HTTP servers listen on loopback, which a plugin reaches
	// only when the operator allows it (egress_test.go has the default).
	cfg.HTTP.AllowedNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, m := range mut {
		m(&cfg)
	}
	h, err := wasmhost.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("new host: %v", err)
	}
	tb.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

func loadTool(tb testing.TB, h *wasmhost.Host, name string, mut ...func(*wasmhost.PluginSpec)) *wasmhost.Tool {
	tb.Helper()
	spec := wasmhost.PluginSpec{Name: name, Version: "0.1.0", Wasm: guest(tb, name)}
	for _, m := range mut {
		m(&spec)
	}
	tool, err := h.LoadTool(context.Background(), spec)
	if err != nil {
		tb.Fatalf("load %s: %v", name, err)
	}
	tb.Cleanup(func() { _ = tool.Close(context.Background()) })
	return tool
}

// recordingSink keeps every plugin log record.
type recordingSink struct {
	mu      sync.Mutex
	records []wasmhost.LogRecord
}

func (s *recordingSink) WritePluginLog(r wasmhost.LogRecord) {
	s.mu.Lock()
	s.records = append(s.records, r)
	s.mu.Unlock()
}

func (s *recordingSink) all() []wasmhost.LogRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]wasmhost.LogRecord(nil), s.records...)
}

// collectContinuously runs the garbage collector in a loop (a guest's
// call must be stoppable while the runtime stops the world over and over)
// until the returned function is called, which waits for the loop to end.
func collectContinuously() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
				runtime.GC()
			}
		}
	}()
	return func() { close(quit); <-done }
}
