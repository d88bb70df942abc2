//go:build wasip1

package memory

import (
	"encoding/json"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/plugins/pdk/internal/guest"
)

// Capabilities are the optional exports the plugin implements. Without
// Count the host never calls Count.
type Capabilities struct {
	Count bool
}

// Entry is one stored memory.
type Entry = abi.MemoryEntry

// Memory is one memory backend. A returned error is the backend's own
// failure, reported to the host as such.
type Memory interface {
	Name() string
	Capabilities() Capabilities
	// Store stores e, replacing an entry with the same key.
	Store(e Entry) error
	// Recall returns at most limit entries matching query, best first.
	Recall(query string, limit int) ([]Entry, error)
	// Forget removes key and reports whether it existed.
	Forget(key string) (bool, error)
	Count() (int, error)
}

var registered Memory

// Register installs the plugin's memory backend. Call it once, from init.
func Register(m Memory) { registered = m }

//go:wasmexport memory_name
func memoryName() uint64 { return guest.ReturnJSON(registered.Name()) }

//go:wasmexport memory_capabilities
func memoryCapabilities() uint64 {
	flags := []string{}
	if registered.Capabilities().Count {
		flags = append(flags, abi.FlagCount)
	}
	return guest.ReturnJSON(flags)
}

//go:wasmexport memory_store
func memoryStore(ptr, size uint32) uint64 {
	e, err := decodeEntry(guest.Take(ptr, size))
	if err != nil {
		return guest.ReturnErr("malformed entry: " + err.Error())
	}
	return guest.Result(nil, registered.Store(e))
}

//go:wasmexport memory_recall
func memoryRecall(ptr, size uint32) uint64 {
	var a abi.RecallArgs
	if err := json.Unmarshal(guest.Take(ptr, size), &a); err != nil {
		return guest.ReturnErr("malformed query: " + err.Error())
	}
	entries, err := registered.Recall(a.Query, a.Limit)
	if err != nil {
		return guest.ReturnErr(err.Error())
	}
	b, err := recallAnswer(entries)
	if err != nil {
		return guest.ReturnErr(err.Error())
	}
	return guest.Return(b)
}

//go:wasmexport memory_forget
func memoryForget(ptr, size uint32) uint64 {
	var a abi.ForgetArgs
	if err := json.Unmarshal(guest.Take(ptr, size), &a); err != nil {
		return guest.ReturnErr("malformed argument: " + err.Error())
	}
	return guest.Result(registered.Forget(a.Key))
}

//go:wasmexport memory_count
func memoryCount() uint64 { return guest.Result(registered.Count()) }
