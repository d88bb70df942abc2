package wasmhost

import (
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
)

// Interrupt selects how the wall-clock deadline stops guest code.
type Interrupt int

const (
	// InterruptWatchdog (the default) stops a guest at the deadline by
	// raising its interrupt flag (wasmbin), which the fuel test already at
	// every loop header and function entry reads: the guest traps at its
	// next loop iteration or call. The fuel test reads the flag anyway, so
	// the watchdog costs nothing while the deadline is not reached.
	//
	// Measured on this 2-core machine with BenchmarkInterrupt (go test
	// -run '^$' -bench Interrupt -benchtime 1x ./services/pluginsandbox/wasmhost),
	// Go guest, both modes with fuel metering on, two runs (load 4.4):
	//   CPU loop, 1e6 iterations:  watchdog 2.0-4.1 ms, close-on-done 27 ms
	//   echo execute p50:          watchdog 187-286 us, close-on-done 188-240 us
	//   infinite loop, 200 ms deadline, stopped after: watchdog 200-201 ms,
	//   close-on-done 201-202 ms.
	// Hence the watchdog: the same stop latency without a call into the
	// runtime at every loop header.
	InterruptWatchdog Interrupt = iota
	// InterruptCloseOnDone uses wazero's WithCloseOnContextDone, which
	// checks the context at every loop header and function entry.
	InterruptCloseOnDone
)

// HTTPLimits cap the outbound HTTP import.
type HTTPLimits struct {
	// MaxRequestBytes caps a request body; default 1 MiB.
	MaxRequestBytes int64
	// MaxResponseBytes caps a response body; default 4 MiB. A larger
	// response is refused with too-large, never truncated.
	MaxResponseBytes int64
	// Timeout caps one request; default 10 s. The call deadline still wins.
	Timeout time.Duration
	// AllowedNetworks are plugins.http.allowed_networks: addresses that
	// are not public (loopback, private, link-local, shared) are refused
	// unless inside one of them.
	AllowedNetworks []netip.Prefix
}

// Config configures a Host. Zero values take the defaults noted.
type Config struct {
	// Limits are the per-call limits; zero fields are an error, not a
	// default, except that an all-zero Limits means DefaultLimits.
	Limits Limits
	// CacheDir holds wazero's compilation cache; empty keeps it in memory.
	CacheDir string
	// CacheMaxBytes bounds CacheDir (cachedir.go); default
	// DefaultCacheMaxBytes.
	CacheMaxBytes int64
	// PoolSize is the number of pre-instantiated instances kept per tool
	// module; default 2. Zero after defaults means 2; use -1 for none.
	PoolSize int
	// Logger receives host events and, unless LogSink is set, plugin logs.
	Logger *zap.Logger
	// Progress, when set, is told what a load does now ("compiling
	// plugin echo (tool world)", "waiting for another replica's
	// compile ..."): the sandbox's start says it in its health, so that
	// the launcher sees a long start progress rather than stall.
	Progress func(what string)
	// LogSink, when set, receives plugin log records instead of Logger.
	LogSink LogSink
	// LogIdleReport is how often the log drain wakes when idle to report the
	// drop counter; default 1 s.
	LogIdleReport time.Duration
	// HTTP caps the outbound HTTP import.
	HTTP HTTPLimits
	// Interrupt selects the deadline mechanism; see InterruptWatchdog.
	Interrupt Interrupt
	// DeterministicWASI gives guests wazero's fake clocks and a fixed random
	// stream, so that a guest's fuel count is reproducible (the Go runtime
	// draws random numbers and reads the clock, which moves its count by a
	// fraction of a percent). For tests and benchmarks only: every instance
	// then sees the same "random" bytes.
	DeterministicWASI bool
	// DisableFuel skips fuel instrumentation. Only for benchmarks that
	// measure the cost of metering; calls are then bounded by the deadline
	// alone.
	DisableFuel bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Limits == (Limits{}) {
		c.Limits = DefaultLimits()
	}
	if err := c.Limits.Validate(); err != nil {
		return c, err
	}
	if c.CacheMaxBytes <= 0 {
		c.CacheMaxBytes = DefaultCacheMaxBytes
	}
	if c.PoolSize == 0 {
		c.PoolSize = 2
	}
	if c.PoolSize < 0 {
		c.PoolSize = 0
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.LogIdleReport <= 0 {
		c.LogIdleReport = time.Second
	}
	if c.HTTP.MaxRequestBytes <= 0 {
		c.HTTP.MaxRequestBytes = 1 << 20
	}
	if c.HTTP.MaxResponseBytes <= 0 {
		c.HTTP.MaxResponseBytes = 4 << 20
	}
	if c.HTTP.Timeout <= 0 {
		c.HTTP.Timeout = 10 * time.Second
	}
	if c.Interrupt != InterruptWatchdog && c.Interrupt != InterruptCloseOnDone {
		return c, fmt.Errorf("%w: unknown interrupt mode %d", ErrInvalidLimits, c.Interrupt)
	}
	return c, nil
}
