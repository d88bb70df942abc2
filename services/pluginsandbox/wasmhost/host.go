package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"go.uber.org/zap"
)

// Host runs plugins. It is safe for concurrent use. Create it with New and
// release it with Close.
type Host struct {
	cfg    Config
	rt     wazero.Runtime
	cache  wazero.CompilationCache
	slots  *slots
	logs   *logQueue
	http   *http.Client
	mem    *memBudget
	logger *zap.Logger

	mu     sync.Mutex
	pools  map[*pool]struct{}
	closed atomic.Bool

	reaper reaper // closes used instances off the callers' path

	// started is when the host was made, less fileClockSlack: cache
	// entries written since are in use. trimMu serializes the cache's
	// trims (trimCache).
	started time.Time
	trimMu  sync.Mutex

	// Close runs each of its steps once, however often it is called.
	stopPools, stopLogs, closeRuntime sync.Once

	// Running guest code must never see its module closed under it: an
	// instance's memory is unmapped on close, and the guest would fault.
	// Close cancels the running calls (stopCalls) and waits for them.
	callMu    sync.Mutex
	calls     int
	callsIdle chan struct{} // closed when calls reach zero once Close waits
	stopCtx   context.Context
	stopCalls context.CancelFunc
}

// New validates cfg, fills its defaults and starts a host: one wazero
// runtime with the memory page limit, WASI preview 1 (no preopens, no
// environment, no network) and the "clawmesh" imports.
func New(ctx context.Context, cfg Config) (*Host, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rc := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(cfg.Limits.memoryPages()).
		WithCloseOnContextDone(cfg.Interrupt == InterruptCloseOnDone).
		WithDebugInfoEnabled(false)
	h := &Host{
		cfg:     cfg,
		slots:   newSlots(int(cfg.Limits.MaxInstances)),
		http:    newHTTPClient(cfg.HTTP.AllowedNetworks),
		mem:     newMemBudget(cfg.Limits.MaxTotalMemoryMB),
		logger:  cfg.Logger,
		pools:   map[*pool]struct{}{},
		started: time.Now().Add(-fileClockSlack),
	}
	h.stopCtx, h.stopCalls = context.WithCancel(context.Background())
	if cfg.CacheDir != "" {
		if h.cache, err = wazero.NewCompilationCacheWithDir(cfg.CacheDir); err != nil {
			return nil, fmt.Errorf("wasmhost: compilation cache: %w", err)
		}
		rc = rc.WithCompilationCache(h.cache)
		h.trimCache()
	}
	h.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, h.rt); err != nil {
		_ = h.rt.Close(ctx)
		return nil, fmt.Errorf("wasmhost: wasi: %w", err)
	}
	if err := h.instantiateImports(ctx); err != nil {
		_ = h.rt.Close(ctx)
		return nil, fmt.Errorf("wasmhost: host imports: %w", err)
	}
	sink := cfg.LogSink
	if sink == nil {
		sink = zapSink{l: cfg.Logger.Named("plugin")}
	}
	h.logs = newLogQueue(sink, cfg.Logger, cfg.LogIdleReport)
	h.slots.evict = h.evictIdle
	h.reaper.start(h, int(cfg.Limits.MaxInstances))
	return h, nil
}

// Limits returns the limits in force.
func (h *Host) Limits() Limits { return h.cfg.Limits }

// LogStats returns the logging queue's counters.
func (h *Host) LogStats() LogStats { return h.logs.stats() }

// InstancesInUse returns the number of live instances (pooled, running and
// persistent).
func (h *Host) InstancesInUse() int { return h.slots.inUse() }

// Close cancels the running calls, stops every pool and the reaper (after
// the instance closes queued to it), waits for the calls to leave guest
// code, stops the log drain and closes the runtime. When ctx ends first,
// Close stops the log drain all the same and returns an error, leaving
// only the runtime open: closing it would fault the guests still running.
// A later Close waits for them again and closes the runtime; once one has,
// Close returns nil.
func (h *Host) Close(ctx context.Context) error {
	if h.closed.CompareAndSwap(false, true) {
		h.stopCalls()
	}
	h.stopPools.Do(func() {
		for _, p := range h.poolList() {
			p.close()
		}
		h.reaper.stop()
	})
	waitErr := h.waitCalls(ctx)
	h.stopLogs.Do(h.logs.close)
	if waitErr != nil {
		return waitErr
	}
	var err error
	h.closeRuntime.Do(func() {
		err = h.rt.Close(ctx)
		if h.cache != nil {
			err = errors.Join(err, h.cache.Close(ctx))
		}
	})
	return err
}

// waitCalls waits, within ctx, until no call runs guest code.
func (h *Host) waitCalls(ctx context.Context) error {
	h.callMu.Lock()
	if h.calls == 0 {
		h.callMu.Unlock()
		return nil
	}
	if h.callsIdle == nil {
		h.callsIdle = make(chan struct{})
	}
	idle := h.callsIdle
	h.callMu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wasmhost: close: guest calls still running: %w", ctx.Err())
	}
}

// beginCall registers a call about to run guest code; false once Close
// has begun.
func (h *Host) beginCall() bool {
	h.callMu.Lock()
	defer h.callMu.Unlock()
	if h.closed.Load() {
		return false
	}
	h.calls++
	return true
}

func (h *Host) endCall() {
	h.callMu.Lock()
	defer h.callMu.Unlock()
	h.calls--
	if h.calls == 0 && h.callsIdle != nil {
		close(h.callsIdle)
		h.callsIdle = nil
	}
}

func (h *Host) addPool(p *pool) {
	h.mu.Lock()
	h.pools[p] = struct{}{}
	h.mu.Unlock()
}

func (h *Host) removePool(p *pool) {
	h.mu.Lock()
	delete(h.pools, p)
	h.mu.Unlock()
}

// poolList is a copy of the set of pools, to work on without h.mu.
func (h *Host) poolList() []*pool {
	h.mu.Lock()
	defer h.mu.Unlock()
	pools := make([]*pool, 0, len(h.pools))
	for p := range h.pools {
		pools = append(pools, p)
	}
	return pools
}

// evictIdle closes one idle pooled instance of any module.
func (h *Host) evictIdle() bool {
	for _, p := range h.poolList() {
		if p.evictOne() {
			return true
		}
	}
	return false
}

// kickPools asks every pool below its size to refill.
func (h *Host) kickPools() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.pools {
		p.kick()
	}
}

// callContext bounds one call by plugins.limits.call_timeout_ms.
func (h *Host) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, h.cfg.Limits.callTimeout(), errCallDeadline)
}

// errCallDeadline is the cause of a call context's timeout.
var errCallDeadline = errors.New("call deadline")
