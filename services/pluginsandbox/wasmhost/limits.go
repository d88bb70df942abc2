package wasmhost

import (
	"fmt"
	"time"

	"github.com/clawmesh/clawmesh/internal/configclient"
)

// Limits are the per-call limits of seed 003, under the names of the
// plugins.limits config section. Every field must be non-zero.
type Limits struct {
	// CallFuel is plugins.limits.call_fuel: instruction units per call.
	CallFuel uint64
	// CallTimeoutMS is plugins.limits.call_timeout_ms: wall clock per call,
	// host imports included.
	CallTimeoutMS uint64
	// MaxMemoryMB is plugins.limits.max_memory_mb: linear memory per instance.
	MaxMemoryMB uint64
	// MaxTableElements is plugins.limits.max_table_elements, per table.
	MaxTableElements uint64
	// MaxInstances is plugins.limits.max_instances, host-wide.
	MaxInstances uint64
	// MaxTotalMemoryMB is plugins.limits.max_total_memory_mb: the linear
	// memory every instance of the host holds together.
	MaxTotalMemoryMB uint64
}

// DefaultLimits returns the defaults of seed 003, as the config schema
// (internal/configschema) writes them.
func DefaultLimits() Limits {
	return LimitsFrom(configclient.Snapshot{}.PluginSettings())
}

// LimitsFrom takes the limits of the plugins.* settings.
func LimitsFrom(s configclient.PluginSettings) Limits {
	return Limits{
		CallFuel:         s.CallFuel,
		CallTimeoutMS:    uint64(s.CallTimeout.Milliseconds()),
		MaxMemoryMB:      s.MaxMemoryMB,
		MaxTableElements: s.MaxTableElements,
		MaxInstances:     s.MaxInstances,
		MaxTotalMemoryMB: s.MaxTotalMemoryMB,
	}
}

// maxMemoryMB is what a wasm32 address space allows.
const maxMemoryMB = 4096

// maxTotalMemoryMB bounds plugins.limits.max_total_memory_mb (1 TiB).
const maxTotalMemoryMB = 1 << 20

// Validate reports the first zero or out-of-range limit.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    uint64
	}{
		{"plugins.limits.call_fuel", l.CallFuel},
		{"plugins.limits.call_timeout_ms", l.CallTimeoutMS},
		{"plugins.limits.max_memory_mb", l.MaxMemoryMB},
		{"plugins.limits.max_table_elements", l.MaxTableElements},
		{"plugins.limits.max_instances", l.MaxInstances},
		{"plugins.limits.max_total_memory_mb", l.MaxTotalMemoryMB},
	} {
		if f.v == 0 {
			return fmt.Errorf("%w: %s must be non-zero", ErrInvalidLimits, f.name)
		}
	}
	if l.MaxMemoryMB > maxMemoryMB {
		return fmt.Errorf("%w: plugins.limits.max_memory_mb %d exceeds the wasm32 address space (%d)", ErrInvalidLimits, l.MaxMemoryMB, maxMemoryMB)
	}
	if l.MaxTotalMemoryMB > maxTotalMemoryMB {
		return fmt.Errorf("%w: plugins.limits.max_total_memory_mb %d is too large", ErrInvalidLimits, l.MaxTotalMemoryMB)
	}
	if l.CallFuel > 1<<62 {
		return fmt.Errorf("%w: plugins.limits.call_fuel %d is too large", ErrInvalidLimits, l.CallFuel)
	}
	return nil
}

func (l Limits) callTimeout() time.Duration { return time.Duration(l.CallTimeoutMS) * time.Millisecond }

func (l Limits) memoryPages() uint32 { return uint32(l.MaxMemoryMB * 16) }
