package wasmhost

import "errors"

// Sentinel errors. Errors returned by this package wrap one of them (and,
// where a limit stopped a call, say which limit and its value).
var (
	// ErrInvalidLimits: a limit is zero or otherwise unusable.
	ErrInvalidLimits = errors.New("wasmhost: invalid limits")
	// ErrFuelExhausted: the call spent plugins.limits.call_fuel.
	ErrFuelExhausted = errors.New("wasmhost: out of fuel")
	// ErrCallTimeout: the call ran past plugins.limits.call_timeout_ms.
	ErrCallTimeout = errors.New("wasmhost: call timed out")
	// ErrCancelled: the caller cancelled the call.
	ErrCancelled = errors.New("wasmhost: call cancelled")
	// ErrMemoryLimit: the guest ran out of linear memory under
	// plugins.limits.max_memory_mb.
	ErrMemoryLimit = errors.New("wasmhost: memory limit reached")
	// ErrMemoryBudget: the host's instances together hold
	// plugins.limits.max_total_memory_mb, so an instance could not be
	// made, or could not grow its memory.
	ErrMemoryBudget = errors.New("wasmhost: the sandbox's memory budget is spent")
	// ErrTableLimit: a table breaks plugins.limits.max_table_elements.
	ErrTableLimit = errors.New("wasmhost: table limit")
	// ErrInstanceLimit: no instance slot became free before the deadline
	// (plugins.limits.max_instances).
	ErrInstanceLimit = errors.New("wasmhost: instance limit reached")
	// ErrTrap: the guest trapped, panicked or exited.
	ErrTrap = errors.New("wasmhost: guest trapped")
	// ErrABI: the module does not speak the plugin ABI (version, exports) or
	// returned a malformed result.
	ErrABI = errors.New("wasmhost: ABI violation")
	// ErrInvalidModule: the module failed to decode, validate or compile.
	ErrInvalidModule = errors.New("wasmhost: invalid module")
	// ErrUnavailable: the plugin instance is broken and awaits a rebuild by
	// its owner, or the host is closed.
	ErrUnavailable = errors.New("wasmhost: plugin unavailable")
	// ErrConfig: the plugin's config could not be resolved or failed its
	// schema; no guest code ran.
	ErrConfig = errors.New("wasmhost: plugin config rejected")
	// ErrClosed: the host or module is closed.
	ErrClosed = errors.New("wasmhost: closed")
	// ErrConfigUnavailable: a ConfigSource could not reach its store (the
	// config service is down). Resolve wraps it; the host then wraps it in
	// ErrConfig, and guest imports answer unavailable.
	ErrConfigUnavailable = errors.New("wasmhost: plugin config unavailable")
	// ErrPluginFailed: a channel or memory export returned its err result
	// (the plugin's own failure, not a limit); the message follows.
	ErrPluginFailed = errors.New("wasmhost: plugin reported an error")
	// ErrUnsupported: the plugin does not advertise the capability flag of
	// an optional export that has no documented default.
	ErrUnsupported = errors.New("wasmhost: capability not advertised")
)
