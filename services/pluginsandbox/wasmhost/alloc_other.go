//go:build !linux

package wasmhost

import (
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// memoryAllocator returns nil off Linux: wazero's default allocator, which
// copies on growth, is used there, and the memory budget is not counted.
func memoryAllocator(*memBudget, *atomic.Bool) experimental.MemoryAllocator { return nil }
