//go:build wasip1

package observer

import (
	"encoding/json"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/plugins/pdk/internal/guest"
)

// Event is one host event; Kind is one of the abi.Observer* kinds.
type Event = abi.ObserverEvent

// Observer is one observability backend. A returned error is the
// backend's own failure, reported to the host as such.
type Observer interface {
	Name() string
	RecordEvent(e Event) error
	// Flush is called when the host unloads the observer.
	Flush() error
}

var registered Observer

// Register installs the plugin's observer. Call it once, from init.
func Register(o Observer) { registered = o }

//go:wasmexport observer_name
func observerName() uint64 { return guest.ReturnJSON(registered.Name()) }

//go:wasmexport observer_record_event
func observerRecordEvent(ptr, size uint32) uint64 {
	var e Event
	if err := json.Unmarshal(guest.Take(ptr, size), &e); err != nil {
		return guest.ReturnErr("malformed event: " + err.Error())
	}
	return guest.Result(nil, registered.RecordEvent(e))
}

//go:wasmexport observer_flush
func observerFlush() uint64 { return guest.Result(nil, registered.Flush()) }
