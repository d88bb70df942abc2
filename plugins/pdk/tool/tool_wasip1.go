//go:build wasip1

package tool

import (
	"encoding/json"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/plugins/pdk/internal/guest"
)

// Result is the tool-result record: what the model sees.
type Result = abi.ToolResult

// Tool is one callable tool. Execute receives the arguments as JSON (with the
// host-injected "__config" object when the plugin has public config); a
// returned error is a tool failure the host reports as such.
type Tool interface {
	Name() string
	Description() string
	ParametersSchema() json.RawMessage
	Execute(args json.RawMessage) (Result, error)
}

var registered Tool

// Register installs the plugin's tool. Call it once, from init.
func Register(t Tool) { registered = t }

// Failure builds a Result with success false.
func Failure(msg string) Result { return Result{Success: false, Error: &msg} }

//go:wasmexport tool_name
func toolName() uint64 { return guest.ReturnJSON(registered.Name()) }

//go:wasmexport tool_description
func toolDescription() uint64 { return guest.ReturnJSON(registered.Description()) }

//go:wasmexport tool_parameters_schema
func toolParametersSchema() uint64 { return guest.Return(registered.ParametersSchema()) }

//go:wasmexport tool_execute
func toolExecute(ptr, size uint32) uint64 {
	args := guest.Take(ptr, size)
	res, err := registered.Execute(args)
	env := abi.ToolEnvelope{Ok: &res}
	if err != nil {
		msg := err.Error()
		env = abi.ToolEnvelope{Err: &msg}
	}
	return guest.Return(env.AppendJSON(make([]byte, 0, envelopeRoom+len(res.Output))))
}

// envelopeRoom is what the envelope adds to the output: its keys, and
// room for a short error and a few escapes.
const envelopeRoom = 128

// warmEnvelope is an envelope written in the module's initialisation, so
// that a fresh instance's allocator already holds a span of the size a
// short result takes, instead of taking one in the call (10,500 fuel
// units of the echo tool's 77,000).
var warmEnvelope []byte

func init() {
	msg := "warm-up"
	warmEnvelope = abi.ToolEnvelope{Ok: &Result{Success: true, Output: msg}}.AppendJSON(make([]byte, 0, envelopeRoom+len(msg)))
}
