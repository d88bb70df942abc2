//go:build wasip1

package guest

// Work a Go guest does on the first export call of an instance and never
// again is done here, in the module's initialisation, instead: the host
// runs _initialize when it pre-instantiates (a tool's pool), off the call's
// path, and every instance starts from the same warmed state, so no call
// leaves anything for the next one (each tool call still gets an instance
// no earlier call touched).
//
// Measured with the echo tool (fuel units, about one wasm instruction
// each, block, loop and end then included): its first call cost 1.31
// million, a second call in the same instance 0.09 million. Half of the
// difference was the export's goroutine growing its stack by copying (a Go
// stack starts at 8 KiB and encoding/json recurses), the rest
// encoding/json building its per-type caches and the allocator's first
// spans.

// warmStackFrames is how many 1 KiB frames growStack nests: 32 KiB in use,
// so the stack that export calls run on is 64 KiB before the first call.
const warmStackFrames = 32

// growStack nests depth frames of 1 KiB, making the runtime grow the
// goroutine's stack to fit them. Export calls run on the same goroutine as
// the package initialisers (the runtime keeps it for callbacks), and a stack
// is only shrunk by a garbage collection that finds it mostly unused.
//
//go:noinline
func growStack(depth int) byte {
	var pad [1024]byte
	pad[depth%len(pad)] = byte(depth)
	if depth > 0 {
		pad[0] += growStack(depth - 1)
	}
	return pad[0]
}

var warmSink byte

func init() {
	warmSink = growStack(warmStackFrames)
	// The live map's first insert allocates its table.
	Take(pin(make([]byte, 1)), 1)
}
