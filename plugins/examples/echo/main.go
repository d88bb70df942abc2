//go:build wasip1

// Command echo is the smallest tool plugin: it returns its "text" argument.
package main

import (
	"encoding/json"

	"github.com/clawmesh/clawmesh/plugins/pdk/tool"
)

type echo struct{}

func (echo) Name() string        { return "echo" }
func (echo) Description() string { return "Returns the text it is given." }
func (echo) ParametersSchema() json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)
}

func (echo) Execute(args json.RawMessage) (tool.Result, error) {
	var in struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(args, &in); err != nil {
		return tool.Failure("arguments are not valid JSON: " + err.Error()), nil
	}
	return tool.Result{Success: true, Output: in.Text}, nil
}

func init() { tool.Register(echo{}) }

func main() {}
