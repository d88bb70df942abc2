package wasmhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/testwait"
	wb "github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin/wasmbuild"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

func args(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// keepServing runs echo calls until stop is closed and reports failures: the
// host must keep serving other calls while a guest misbehaves.
func keepServing(t *testing.T, echo *wasmhost.Tool) (stop func() int) {
	done := make(chan struct{})
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			res, err := echo.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"text": "still here"})})
			if err != nil || res.Output != "still here" {
				t.Errorf("echo during misbehaviour: %+v, %v", res, err)
				return
			}
			n.Add(1)
		}
	}()
	return func() int { close(done); wg.Wait(); return int(n.Load()) }
}

func TestMisbehavingGuestsStoppedByTheRightLimit(t *testing.T) {
	sink := &recordingSink{}
	h := newHost(t, wasmhost.Limits{CallFuel: 200_000_000, CallTimeoutMS: 5_000, MaxMemoryMB: 64}, func(c *wasmhost.Config) {
		c.LogSink = sink
	})
	bad := loadTool(t, h, "misbehave")
	echo := loadTool(t, h, "echo")

	cases := []struct {
		name string
		args map[string]any
		want error
	}{
		{"infinite loop: fuel", map[string]any{"mode": "loop"}, wasmhost.ErrFuelExhausted},
		{"memory hog: memory", map[string]any{"mode": "memhog", "mb": 200}, wasmhost.ErrMemoryLimit},
		{"panic: trap", map[string]any{"mode": "panic"}, wasmhost.ErrTrap},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stop := keepServing(t, echo)
			_, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(c.args)})
			served := stop()
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			t.Logf("stopped with %v; %d echo calls served meanwhile", err, served)
		})
	}

	t.Run("memory hog within the limit succeeds", func(t *testing.T) {
		res, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "memhog", "mb": 16})})
		if err != nil || !res.Success {
			t.Fatalf("memhog 16 MiB: %+v, %v", res, err)
		}
	})
}

func TestInfiniteLoopStoppedByDeadline(t *testing.T) {
	for _, mode := range []wasmhost.Interrupt{wasmhost.InterruptWatchdog, wasmhost.InterruptCloseOnDone} {
		t.Run(fmt.Sprint("interrupt ", mode), func(t *testing.T) {
			h := newHost(t, wasmhost.Limits{CallFuel: 1 << 60, CallTimeoutMS: 200}, func(c *wasmhost.Config) { c.Interrupt = mode })
			bad := loadTool(t, h, "misbehave")
			// Collect garbage all along: a stop-the-world must not wait
			// forever for the looping guest (it yields to Go periodically).
			stopGC := collectContinuously()
			start := time.Now()
			_, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "loop"})})
			elapsed := time.Since(start)
			stopGC()
			if !errors.Is(err, wasmhost.ErrCallTimeout) {
				t.Fatalf("err = %v, want ErrCallTimeout", err)
			}
			// The loop never ends by itself: any return within the test
			// proves the deadline; the bound only keeps a hang short.
			if elapsed > 10*time.Second {
				t.Fatalf("stopped after %v", elapsed)
			}
			t.Logf("stopped after %v", elapsed)
		})
	}
}

func TestGuestSleepEndsAtDeadline(t *testing.T) {
	h := newHost(t, wasmhost.Limits{CallTimeoutMS: 200})
	bad := loadTool(t, h, "misbehave")
	start := time.Now()
	_, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "sleep", "ms": 5000})})
	// Well under the 5 s sleep, with room for a loaded machine: the
	// deadline cut the sleep, not its end.
	if !errors.Is(err, wasmhost.ErrCallTimeout) || time.Since(start) > 4*time.Second {
		t.Fatalf("err = %v after %v, want ErrCallTimeout near 200ms", err, time.Since(start))
	}
}

func TestFuelIsDeterministic(t *testing.T) {
	deterministic := func(c *wasmhost.Config) { c.DeterministicWASI = true }
	h := newHost(t, wasmhost.Limits{CallFuel: 1_000_000_000}, deterministic)
	bad := loadTool(t, h, "misbehave")
	// Large enough that half its need still covers _initialize (about 1.4
	// million units for a Go guest, run under the same per-call budget).
	call := wasmhost.ToolCall{Args: args(map[string]any{"mode": "spin", "n": 1_000_000})}
	var used []uint64
	for i := 0; i < 3; i++ {
		res, err := bad.Execute(context.Background(), call)
		if err != nil || !res.Success {
			t.Fatalf("spin with a large budget: %+v, %v", res, err)
		}
		used = append(used, res.FuelUsed)
	}
	if used[0] != used[1] || used[1] != used[2] || used[0] == 0 {
		t.Fatalf("fuel used across runs = %v, want equal and non-zero", used)
	}
	t.Logf("spin(1000000) uses %d fuel", used[0])

	small := newHost(t, wasmhost.Limits{CallFuel: used[0] / 2}, deterministic)
	bad2 := loadTool(t, small, "misbehave")
	if _, err := bad2.Execute(context.Background(), call); !errors.Is(err, wasmhost.ErrFuelExhausted) {
		t.Fatalf("spin with half the budget: err = %v, want ErrFuelExhausted", err)
	}
}

func TestTableGrowerRefusedAtLoad(t *testing.T) {
	h := newHost(t, wasmhost.Limits{MaxTableElements: 1000})
	var b wb.Builder
	ty := b.Type(nil, []byte{wb.I32})
	b.Table(1, 0, false) // no maximum
	b.Memory(1, 1, true)
	// ref.null func; i32.const 50000000; table.grow 0
	b.ExportFunc("grow", b.Func(ty, nil, []byte{0xd0, 0x70, 0x41, 0x80, 0xe1, 0xeb, 0x17, 0xfc, 0x0f, 0x00, 0x0b}))
	_, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "grower", Wasm: b.Bytes()})
	if !errors.Is(err, wasmhost.ErrTableLimit) {
		t.Fatalf("err = %v, want ErrTableLimit", err)
	}
	var b2 wb.Builder
	b2.Table(10, 5000, true) // maximum over the limit
	b2.Memory(1, 1, true)
	if _, err := h.LoadTool(context.Background(), wasmhost.PluginSpec{Name: "big", Wasm: b2.Bytes()}); !errors.Is(err, wasmhost.ErrTableLimit) {
		t.Fatalf("err = %v, want ErrTableLimit", err)
	}
}

func TestSlowHTTPImportCutByDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "late")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	h := newHost(t, wasmhost.Limits{CallTimeoutMS: 200})
	fetch := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	start := time.Now()
	_, err := fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})})
	elapsed := time.Since(start)
	if !errors.Is(err, wasmhost.ErrCallTimeout) {
		t.Fatalf("err = %v, want ErrCallTimeout", err)
	}
	// The server answers only at cleanup: returning at all is the cut; the
	// bound, well under the 5 s a slow import would take, keeps it honest.
	if elapsed > 4*time.Second {
		t.Fatalf("cut after %v, want about 200ms", elapsed)
	}
	t.Logf("cut after %v", elapsed)
}

func TestHTTPNeedsGrant(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hi") }))
	t.Cleanup(srv.Close)
	h := newHost(t, wasmhost.Limits{})
	denied := loadTool(t, h, "httpfetch")
	res, err := denied.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})})
	if err != nil || res.Success || res.Error == nil || !strings.Contains(*res.Error, "access-denied") {
		t.Fatalf("without grant: %+v, %v", res, err)
	}
	granted := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	res, err = granted.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})})
	if err != nil || !res.Success || res.Output != "200 hi" {
		t.Fatalf("with grant: %+v, %v", res, err)
	}
}

func TestInstanceCap(t *testing.T) {
	const max = 64
	var started atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	// The outbound HTTP cap must outlast the time it takes all 64 calls to
	// reach the server (64 instantiations, slow under -race), or the first
	// calls end early and free their slots.
	h := newHost(t, wasmhost.Limits{MaxInstances: max, CallTimeoutMS: 120_000}, func(c *wasmhost.Config) { c.HTTP.Timeout = 120 * time.Second })
	fetch := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	call := wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})}

	var wg sync.WaitGroup
	errs := make(chan error, max)
	for i := 0; i < max; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := fetch.Execute(context.Background(), call)
			if err == nil && res.Output != "200 ok" {
				err = fmt.Errorf("result %+v", res)
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(90 * time.Second)
	for started.Load() < max {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d calls reached the server", started.Load(), max)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.InstancesInUse(); got != max {
		t.Fatalf("instances in use = %d, want %d", got, max)
	}
	// The 65th waits for a slot until its own deadline, then is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := fetch.Execute(ctx, call)
	cancel()
	if !errors.Is(err, wasmhost.ErrInstanceLimit) {
		t.Fatalf("65th call: err = %v, want ErrInstanceLimit", err)
	}
	// A 65th that waits longer gets a slot once the others finish.
	late := make(chan error, 1)
	go func() {
		_, err := fetch.Execute(context.Background(), call)
		late <- err
	}()
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("one of the %d calls failed: %v", max, err)
		}
	}
	if err := <-late; err != nil {
		t.Fatalf("waiting 65th call: %v", err)
	}
}

// Closing the host while calls run inside guest code cancels them and
// waits for them before any module is closed under them (an instance's
// memory is unmapped on close: closing it under a running guest faults).
func TestCloseWhileCallsRun(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var started atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	h := newHost(t, wasmhost.Limits{CallTimeoutMS: 60_000, CallFuel: 1 << 60})
	fetch := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	loop := loadTool(t, h, "misbehave")
	const n = 8
	errs := make(chan error, 2*n)
	for range n {
		go func() {
			_, err := fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})})
			errs <- err
		}()
		go func() {
			_, err := loop.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"mode": "loop"})})
			errs <- err
		}()
	}
	for deadline := time.Now().Add(60 * time.Second); started.Load() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d fetches reached the server", started.Load(), n)
		}
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 * n {
		if err := <-errs; err == nil {
			t.Fatal("a call running at Close succeeded")
		}
	}
	if _, err := fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL})}); !errors.Is(err, wasmhost.ErrClosed) {
		t.Fatalf("a call after Close: %v", err)
	}
}

// hostGoroutines counts the goroutines a host owns besides the calls: the
// pools' refillers, the reaper and the log drain.
func hostGoroutines() int {
	count := 0
	for _, g := range testwait.Goroutines() {
		if strings.Contains(g, "wasmhost.(*pool).run") || strings.Contains(g, "wasmhost.(*reaper).start") ||
			strings.Contains(g, "wasmhost.(*logQueue).drain") {
			count++
		}
	}
	return count
}

// waitHostGoroutines polls until at most n host goroutines are left (a
// goroutine that has signalled its owner is still on its way out) and
// returns how many are.
func waitHostGoroutines(n int, within time.Duration) int {
	got := hostGoroutines()
	for deadline := time.Now().Add(within); got > n && time.Now().Before(deadline); got = hostGoroutines() {
		time.Sleep(time.Millisecond)
	}
	return got
}

// When Close's context ends while a call still runs guest code, Close
// leaves the runtime open (closing it would fault the guest) but stops
// everything else: the pools (their idle instances closed), the reaper
// and the log drain. A later Close, once the call is over, closes the
// runtime.
func TestCloseGivingUpOnRunningCallsStopsTheRest(t *testing.T) {
	// Earlier tests' hosts are closed; their goroutines may still be
	// exiting.
	before := waitHostGoroutines(0, 5*time.Second)
	h, err := wasmhost.New(context.Background(), wasmhost.Config{Limits: wasmhost.DefaultLimits(), CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	loadHandTool(t, h, minimalTool(0))
	for deadline := time.Now().Add(30 * time.Second); h.InstancesInUse() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pool did not fill")
		}
	}
	if n := hostGoroutines(); n <= before {
		t.Fatalf("%d host goroutines with a pool, %d before the host", n, before)
	}
	release, ok := h.HoldCall()
	if !ok {
		t.Fatal("could not register a call")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := h.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a call running: %v, want DeadlineExceeded", err)
	}
	if n := waitHostGoroutines(before, 10*time.Second); n > before {
		t.Errorf("%d host goroutines after Close gave up, %d before the host", n, before)
	}
	if n := h.InstancesInUse(); n != 0 {
		t.Errorf("%d pooled instances after Close gave up, want 0", n)
	}
	if _, ok := h.HoldCall(); ok {
		t.Error("a call began after Close")
	}
	// Still running: a second Close gives up again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if err := h.Close(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Close with a call running: %v, want DeadlineExceeded", err)
	}
	release()
	if err := h.Close(context.Background()); err != nil {
		t.Fatalf("Close once the call is over: %v", err)
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatalf("Close after Close: %v", err)
	}
}

// MaxResponseBytes bounded a response's body only: 9 MiB of headers were
// read, and given to the guest as JSON six bytes to one for each <. A
// response whose headers pass 64 KiB is refused as too large; one that
// redirects more than five times is not followed on.
func TestHTTPResponseHeadersBounded(t *testing.T) {
	var hops atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/headers":
			w.Header().Set("X-Big", strings.Repeat("<", 9<<20))
		case "/loop":
			hops.Add(1)
			http.Redirect(w, r, "/loop", http.StatusFound)
			return
		}
		fmt.Fprint(w, "hi")
	}))
	t.Cleanup(srv.Close)
	h := newHost(t, wasmhost.Limits{}, func(c *wasmhost.Config) { c.HTTP.MaxResponseBytes = 1024 })
	fetch := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	res, err := fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL + "/headers"})})
	if err != nil || res.Success || res.Error == nil || !strings.Contains(*res.Error, "too-large") {
		t.Fatalf("9 MiB of headers: %+v, %v", res, err)
	}
	res, err = fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL + "/loop"})})
	if err != nil || res.Success || hops.Load() != 6 {
		t.Fatalf("a redirect loop: %+v, %v, %d requests", res, err, hops.Load())
	}
	res, err = fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": srv.URL + "/"})})
	if err != nil || !res.Success || res.Output != "200 hi" {
		t.Fatalf("a plain response: %+v, %v", res, err)
	}
}

// Each instance is bounded alone (max_memory_mb), and all of them
// together by max_total_memory_mb: while one call holds 40 MiB, another
// that grows to 60 MiB is refused with the budget's error, where before
// both went on (64 instances of 256 MiB could hold 16 GiB); once the
// first ends, what it held is given back and the same call succeeds.
func TestMemoryBudgetHostWide(t *testing.T) {
	h := newHost(t, wasmhost.Limits{MaxMemoryMB: 64, MaxTotalMemoryMB: 96, CallTimeoutMS: 60_000})
	bad := loadTool(t, h, "misbehave")
	holder := make(chan error, 1)
	go func() {
		res, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "memhog", "mb": 40, "ms": 3000})})
		if err == nil && !res.Success {
			err = fmt.Errorf("result %+v", res)
		}
		holder <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for h.MemoryInUse() < 40<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the holder's memory never reached 40 MiB: %d bytes in use", h.MemoryInUse())
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "memhog", "mb": 60})})
	if !errors.Is(err, wasmhost.ErrMemoryBudget) {
		t.Fatalf("a call growing past the budget: err = %v, want ErrMemoryBudget", err)
	}
	t.Logf("refused: %v", err)
	if err := <-holder; err != nil {
		t.Fatalf("the holder: %v", err)
	}
	// The holder's memory comes back once its instance is closed (off
	// the call's path); a fresh instance kept ready for the next call
	// holds a few MiB.
	for h.MemoryInUse() >= 40<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still counted once every call ended", h.MemoryInUse())
		}
		time.Sleep(5 * time.Millisecond)
	}
	res, err := bad.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]any{"mode": "memhog", "mb": 60})})
	if err != nil || !res.Success {
		t.Fatalf("the same call alone: %+v, %v", res, err)
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := h.MemoryInUse(); n != 0 {
		t.Fatalf("%d bytes still counted once the host closed every instance", n)
	}
}
