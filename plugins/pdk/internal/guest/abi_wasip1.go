//go:build wasip1

package guest

import (
	"encoding/json"
	"unsafe"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// live keeps every buffer handed to the host reachable until it is released:
// argument buffers until the export that receives them takes them, result
// buffers until the host calls dealloc (or drops the instance).
var live = map[uint32][]byte{}

//go:wasmexport clawmesh_abi_version
func abiVersion() uint32 { return abi.Version }

//go:wasmexport alloc
func alloc(size uint32) uint32 {
	if size == 0 {
		return 0
	}
	return pin(make([]byte, size))
}

//go:wasmexport dealloc
func dealloc(ptr, _ uint32) { delete(live, ptr) }

func pin(b []byte) uint32 {
	if len(b) == 0 {
		return 0
	}
	p := uint32(uintptr(unsafe.Pointer(&b[0])))
	live[p] = b
	return p
}

// Take returns the argument buffer the host wrote at ptr (allocated with
// alloc) and releases it from the live set.
func Take(ptr, size uint32) []byte {
	b, ok := live[ptr]
	if !ok || uint32(len(b)) < size {
		return nil
	}
	delete(live, ptr)
	return b[:size]
}

// Return pins b and packs its address and length for an export's result.
func Return(b []byte) uint64 {
	return uint64(pin(b))<<32 | uint64(len(b))
}

// ReturnJSON marshals v and returns it as an export result.
func ReturnJSON(v any) uint64 {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"err": "marshal result: " + err.Error()})
	}
	return Return(b)
}

// Ptr returns the address of b's first byte, or nil for an empty slice.
func Ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// StringPtr returns the address of s's bytes.
func StringPtr(s string) unsafe.Pointer {
	if s == "" {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}

// ReadGrowing calls an import that writes into a guest buffer and returns
// the length it needs (or a negative code); it retries once with a buffer of
// the needed size.
func ReadGrowing(call func(buf unsafe.Pointer, capacity uint32) int64) ([]byte, int64) {
	buf := make([]byte, 512)
	for range 3 {
		n := call(Ptr(buf), uint32(len(buf)))
		if n < 0 {
			return nil, n
		}
		if n <= int64(len(buf)) {
			return buf[:n], n
		}
		buf = make([]byte, n)
	}
	return nil, abi.CodeUnavailable
}

// ReturnOK returns the WIT result envelope {"ok": v}; v may be nil for
// result<_, E>, which encodes {"ok":null}.
func ReturnOK(v any) uint64 {
	b, err := json.Marshal(v)
	if err != nil {
		return ReturnErr("marshal result: " + err.Error())
	}
	return Return(append(append([]byte(`{"ok":`), b...), '}'))
}

// ReturnErr returns the WIT result envelope {"err": msg}.
func ReturnErr(msg string) uint64 {
	b, _ := json.Marshal(map[string]string{"err": msg})
	return Return(b)
}

// Result returns {"ok": v} when err is nil, else {"err": err.Error()}.
func Result(v any, err error) uint64 {
	if err != nil {
		return ReturnErr(err.Error())
	}
	return ReturnOK(v)
}
