//go:build linux

package wasmhost

import (
	"sync/atomic"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapAllocator backs each linear memory with a reservation of its maximum
// size (PROT_NONE, no physical memory) and commits pages as the memory grows,
// so growth never copies: wazero's default copies the whole memory on every
// growth (0.6 to 1.0 s to reach 100 MiB, against 1 to 10 ms here). What it
// commits is charged to the host's memory budget; one is made for each
// instance, and records there when the budget refused a growth.
type mmapAllocator struct {
	budget  *memBudget
	refused *atomic.Bool
}

func (a mmapAllocator) Allocate(_, max uint64) experimental.LinearMemory {
	if max == 0 {
		max = 1 << 16
	}
	buf, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return &sliceMemory{a: a} // address space exhausted: fall back to copying growth
	}
	return &mmapMemory{a: a, buf: buf}
}

// grow charges the budget for n more bytes; first is the memory's first
// commit (its minimum, admitted before the instance was made).
func (a mmapAllocator) grow(n uint64, first bool) bool {
	if a.budget.take(n, first) {
		return true
	}
	a.refused.Store(true)
	return false
}

// sliceMemory is the copying fallback.
type sliceMemory struct {
	a       mmapAllocator
	buf     []byte
	started bool
}

func (s *sliceMemory) Reallocate(size uint64) []byte {
	first := !s.started
	s.started = true
	if n := uint64(len(s.buf)); size > n {
		if !s.a.grow(size-n, first) {
			return nil
		}
	}
	if size > uint64(cap(s.buf)) {
		nb := make([]byte, size, size*2)
		copy(nb, s.buf)
		s.buf = nb
	}
	s.buf = s.buf[:size]
	return s.buf
}

func (s *sliceMemory) Free() {
	s.a.budget.give(uint64(len(s.buf)))
	s.buf = nil
}

type mmapMemory struct {
	a         mmapAllocator
	buf       []byte // the whole reservation
	committed uint64
	started   bool
}

// Reallocate commits up to size bytes and returns the memory; it returns nil
// when size is past the reservation or the budget, or the kernel refuses,
// which wasm sees as a failed memory.grow.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	first := !m.started
	m.started = true
	if m.buf == nil || size > uint64(len(m.buf)) {
		return nil
	}
	if size > m.committed {
		n := size - m.committed
		if !m.a.grow(n, first) {
			return nil
		}
		if err := syscall.Mprotect(m.buf[m.committed:size], syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
			m.a.budget.give(n)
			return nil
		}
		m.committed = size
	}
	return m.buf[:size:size]
}

func (m *mmapMemory) Free() {
	if m.buf != nil {
		_ = syscall.Munmap(m.buf)
		m.buf = nil
		m.a.budget.give(m.committed)
		m.committed = 0
	}
}

// memoryAllocator returns the allocator of one instance.
func memoryAllocator(b *memBudget, refused *atomic.Bool) experimental.MemoryAllocator {
	return mmapAllocator{budget: b, refused: refused}
}
