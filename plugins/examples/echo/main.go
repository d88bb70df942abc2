//go:build wasip1

// Command echo is the smallest tool plugin: it returns the text it is
// given, its "text" argument (or "msg" when there is no "text").
//
// The tool is named "wasm_echo", not "echo": the session service has a
// built-in tool called echo, which wins a name clash.
package main

import (
	"encoding/json"

	"github.com/clawmesh/clawmesh/plugins/pdk/tool"
)

type echo struct{}

func (echo) Name() string        { return "wasm_echo" }
func (echo) Description() string { return "Returns the text it is given." }
func (echo) ParametersSchema() json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"},"msg":{"type":"string"}}}`)
}

type echoArgs struct {
	Text *string `json:"text"`
	Msg  string  `json:"msg"`
}

func (echo) Execute(args json.RawMessage) (tool.Result, error) {
	var in echoArgs
	if err := json.Unmarshal(args, &in); err != nil {
		return tool.Failure("arguments are not valid JSON: " + err.Error()), nil
	}
	if in.Text == nil {
		return tool.Result{Success: true, Output: in.Msg}, nil
	}
	return tool.Result{Success: true, Output: *in.Text}, nil
}

func init() {
	tool.Register(echo{})
	// Decoding once here builds encoding/json's cache for echoArgs while the
	// instance is pre-instantiated, not in its (only) call.
	_ = json.Unmarshal([]byte(`{}`), new(echoArgs))
}

func main() {}
