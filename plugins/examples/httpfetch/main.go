//go:build wasip1

// Command httpfetch is a tool that fetches a URL through the host's
// outbound HTTP import (it needs the http_client grant).
package main

import (
	"encoding/json"
	"strconv"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/tool"
)

type fetch struct{}

func (fetch) Name() string        { return "fetch" }
func (fetch) Description() string { return "Fetches a URL with GET and returns status and body." }
func (fetch) ParametersSchema() json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]}`)
}

func (fetch) Execute(args json.RawMessage) (tool.Result, error) {
	var in struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(args, &in); err != nil {
		return tool.Failure("bad arguments"), nil
	}
	resp, err := pdk.Fetch(pdk.HTTPRequest{Method: "GET", URL: in.URL})
	if err != nil {
		return tool.Failure("fetch: " + err.Error()), nil
	}
	return tool.Result{Success: true, Output: strconv.Itoa(resp.Status) + " " + string(resp.Body)}, nil
}

func init() { tool.Register(fetch{}) }

func main() {}
