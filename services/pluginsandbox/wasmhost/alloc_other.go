//go:build !linux

package wasmhost

import "github.com/tetratelabs/wazero/experimental"

// memoryAllocator returns nil off Linux: wazero's default allocator, which
// copies on growth, is used there.
func memoryAllocator() experimental.MemoryAllocator { return nil }
