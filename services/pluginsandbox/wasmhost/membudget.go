package wasmhost

import (
	"fmt"
	"sync/atomic"
)

// memBudget is plugins.limits.max_total_memory_mb: the linear memory the
// instances of a host have committed together. Each is bounded alone
// (max_memory_mb, 256 MiB by default), but max_instances of them (64)
// could hold 16 GiB: a sandbox in a container of 1 GiB was killed by the
// kernel long before. A growth past the budget fails as one past the
// instance's own limit does (memory.grow answers -1: a Go guest traps
// out of memory, C's malloc returns NULL), and an instance whose minimum
// does not fit is not made.
//
// Only the memory allocator charges it, which is Linux's (alloc_linux.go):
// elsewhere nothing is counted.
type memBudget struct {
	capacity uint64
	used     atomic.Uint64
}

func newMemBudget(mb uint64) *memBudget { return &memBudget{capacity: mb << 20} }

// take charges n bytes if they fit; force charges them regardless (an
// instance's first commit, which its minimum's check admitted: refused
// there, wazero would panic).
func (b *memBudget) take(n uint64, force bool) bool {
	for {
		u := b.used.Load()
		if !force && u+n > b.capacity {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// give returns n bytes taken before.
func (b *memBudget) give(n uint64) {
	if n > 0 {
		b.used.Add(^(n - 1))
	}
}

// fits reports whether n more bytes fit now (racing instantiations may
// each pass it: the budget is passed by at most their minimums).
func (b *memBudget) fits(n uint64) bool { return b.used.Load()+n <= b.capacity }

// spent is the error of a refusal, with the figures.
func (b *memBudget) spent() error {
	return fmt.Errorf("%w: plugins.limits.max_total_memory_mb %d, %d MiB in use by its instances",
		ErrMemoryBudget, b.capacity>>20, b.used.Load()>>20)
}

// MemoryInUse returns the linear memory the host's instances hold
// together, in bytes (0 where the budget is not counted).
func (h *Host) MemoryInUse() uint64 { return h.mem.used.Load() }
