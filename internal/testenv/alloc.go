package testenv

import (
	"math"
	"runtime"
)

// AllocatedBytes is what fn allocated on the heap, the least of three
// runs: what else runs in the process beside it (a pool refilling, the
// runtime) allocates too, and only ever adds.
func AllocatedBytes(fn func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fn()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}
