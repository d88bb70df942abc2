//go:build wasip1

package pdk

import (
	"encoding/json"
	"unsafe"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/plugins/pdk/internal/guest"
)

// Level is a log level.
type Level uint32

// Log levels.
const (
	LevelTrace = Level(abi.LevelTrace)
	LevelDebug = Level(abi.LevelDebug)
	LevelInfo  = Level(abi.LevelInfo)
	LevelWarn  = Level(abi.LevelWarn)
	LevelError = Level(abi.LevelError)
)

// Event is a structured log event. Action and Outcome belong to closed sets
// (see plugins/ABI.md); the host drops a record naming anything else.
type Event = abi.LogEvent

// Log hands a record to the host. It never blocks and never fails: a record
// over 64 KiB, or one the host's queue cannot take, is dropped and counted.
func Log(level Level, ev Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	guest.LogRecord(uint32(level), guest.Ptr(b), uint32(len(b)))
}

// Info logs a message with action "execute" and outcome "success".
func Info(msg string) {
	Log(LevelInfo, Event{Action: "execute", Outcome: "success", Message: msg})
}

// Secret reads a secret property of the plugin's config (one marked
// x-secret in the manifest's schema). Resolve it where you use it and do not
// keep it.
func Secret(name string) (string, error) {
	b, n := guest.ReadGrowing(func(buf unsafe.Pointer, capacity uint32) int64 {
		return guest.SecretsGet(guest.StringPtr(name), uint32(len(name)), buf, capacity)
	})
	if n < 0 {
		return "", codeError(n)
	}
	return string(b), nil
}

// Config returns the plugin's public config (secrets omitted) as JSON.
// A tool also receives it under the "__config" key of its arguments.
func Config() (json.RawMessage, error) {
	b, n := guest.ReadGrowing(guest.ConfigGet)
	if n < 0 {
		return nil, codeError(n)
	}
	return b, nil
}

// HTTPRequest is an outbound request. Body travels base64-encoded;
// TimeoutMS may shorten, never extend, the host's deadline.
type HTTPRequest = abi.HTTPRequest

// HTTPResponse is the answer to an HTTPRequest.
type HTTPResponse = abi.HTTPResponse

// Fetch performs an outbound HTTP request through the host. It needs the
// http_client grant and a world that allows it (tool and channel).
func Fetch(req HTTPRequest) (*HTTPResponse, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, ErrInvalidArgument
	}
	n := guest.HTTPRequest(guest.Ptr(b), uint32(len(b)))
	if n < 0 {
		return nil, codeError(n)
	}
	buf := make([]byte, n)
	if got := guest.HTTPResponse(guest.Ptr(buf), uint32(len(buf))); got != n {
		if got < 0 {
			return nil, codeError(got)
		}
		return nil, ErrUnavailable
	}
	var resp HTTPResponse
	if err := json.Unmarshal(buf, &resp); err != nil {
		return nil, ErrUnavailable
	}
	return &resp, nil
}

// FuelLeft returns the fuel the current call can still spend
// (plugins.limits.call_fuel less what the call has spent so far, in
// Wasmtime's units), exactly as of the moment it is called; negative once
// the budget is spent, as the call is about to stop. A plugin whose work
// grows with what it holds can check it before work it cannot finish, and
// answer with an error of its own rather than be stopped (a stopped
// instance is rebuilt). Any world may call it; it costs a host call, not
// one of a frame's budget of them.
func FuelLeft() int64 { return guest.FuelLeft() }
