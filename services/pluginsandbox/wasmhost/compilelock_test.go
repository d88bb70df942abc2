package wasmhost_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Replicas sharing a cache folder and starting together compiled the
// same plugin each, into the empty folder at once. One compiles now, under
// the folder's lock (beside it: <folder>.lock); the others say they wait
// for it (their start's health shows it) and then load its entry.
func TestReplicasShareOneCompile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wasm-cache")
	// Held by the test first, so that both hosts ask for the module while
	// neither can compile it: the start of two replicas at once.
	lock, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	var mu sync.Mutex
	var waiting []string
	hosts := make([]*wasmhost.Host, 2)
	for i := range hosts {
		h, err := wasmhost.New(context.Background(), wasmhost.Config{CacheDir: dir, Logger: zap.New(core),
			Progress: func(what string) {
				mu.Lock()
				defer mu.Unlock()
				if strings.HasPrefix(what, "waiting for another replica's compile") {
					waiting = append(waiting, what)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close(context.Background())
		hosts[i] = h
	}
	wasm := minimalTool(3)
	errs := make(chan error, len(hosts))
	for _, h := range hosts {
		go func() {
			tool, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "shared", Version: "0.1.0", Wasm: wasm})
			if err == nil {
				_ = tool.Close(context.Background())
			}
			errs <- err
		}()
	}
	testwait.Progress(t, 10*time.Millisecond, func() (int64, bool) {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(waiting)), len(waiting) == len(hosts)
	})
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	for range hosts {
		if err := testwait.Recv(t, errs); err != nil {
			t.Fatalf("load: %v", err)
		}
	}
	compiled := logs.FilterMessage("plugin compiled").Len()
	loaded := logs.FilterMessage("plugin loaded from the compilation cache").Len()
	if compiled != 1 || loaded != 1 {
		t.Fatalf("two replicas loading one module: %d compiled it, %d loaded it (want 1 and 1)", compiled, loaded)
	}
	if waiting[0] != "waiting for another replica's compile (plugin shared, tool world)" {
		t.Fatalf("the wait said %q", waiting[0])
	}
}
