package wasmhost_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Guests are built from source once per test binary, with the standard Go
// toolchain, into a directory shared by every test; hosts share one
// compilation cache so each module is compiled once.
var (
	buildDir string
	cacheDir string
	builds   sync.Map // name -> *guestBuild
)

type guestBuild struct {
	once sync.Once
	wasm []byte
	err  error
}

func TestMain(m *testing.M) {
	var err error
	if buildDir, err = os.MkdirTemp("", "wasmhost-guests-"); err != nil {
		panic(err)
	}
	if cacheDir, err = os.MkdirTemp("", "wasmhost-cache-"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.RemoveAll(cacheDir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// guest returns the wasm of plugins/examples/<name>, building it on first use.
func guest(tb testing.TB, name string) []byte {
	tb.Helper()
	v, _ := builds.LoadOrStore(name, &guestBuild{})
	b := v.(*guestBuild)
	b.once.Do(func() {
		out := filepath.Join(buildDir, name+".wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./plugins/examples/"+name)
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = &buildError{name: name, msg: strings.TrimSpace(string(msg)), err: err}
			return
		}
		b.wasm, b.err = os.ReadFile(out)
	})
	if b.err != nil {
		tb.Fatalf("build guest %s: %v", name, b.err)
	}
	return b.wasm
}

type buildError struct {
	name, msg string
	err       error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.msg }

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
	cfg := wasmhost.Config{Limits: lim, CacheDir: cacheDir}
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
