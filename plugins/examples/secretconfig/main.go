//go:build wasip1

// Command secretconfig is a tool that uses its public config (through
// __config) and a secret (through pdk.Secret), and reports what the
// channel-only config_get import answered it. It reports what
// it saw without ever echoing the secret: only its length and whether it
// matches the "expect" argument.
package main

import (
	"encoding/json"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/tool"
)

type greeter struct{}

func (greeter) Name() string { return "greeter" }
func (greeter) Description() string {
	return "Greets with a configured greeting and checks an API key."
}
func (greeter) ParametersSchema() json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"who":{"type":"string"},"expect":{"type":"string"},"leak":{"type":"boolean"}}}`)
}

func (greeter) Execute(args json.RawMessage) (tool.Result, error) {
	var in struct {
		Who    string `json:"who"`
		Expect string `json:"expect"`
		Leak   bool   `json:"leak"`
		Config struct {
			Greeting string `json:"greeting"`
			Retries  int    `json:"retries"`
		} `json:"__config"`
	}
	if err := json.Unmarshal(args, &in); err != nil {
		return tool.Failure("bad arguments"), nil
	}
	var all map[string]any
	_ = json.Unmarshal(args, &all)
	key, err := pdk.Secret("api_key")
	if err != nil {
		return tool.Failure("secret: " + err.Error()), nil
	}
	if _, err := pdk.Secret("nope"); err == nil {
		return tool.Failure("unknown secret was readable"), nil
	}
	// Seed 003 gives config_get only to channels: a tool must be refused.
	configGet := "ok"
	if _, err := pdk.Config(); err != nil {
		configGet = err.Error()
	}
	pdk.Info("greeting " + in.Who)
	if in.Leak {
		// A misbehaving plugin: the host cannot stop this output, which is
		// why tests check only what the host itself adds.
		return tool.Result{Success: true, Output: key}, nil
	}
	out := map[string]any{
		"greeting":    fmt.Sprintf("%s, %s", in.Config.Greeting, in.Who),
		"retries":     in.Config.Retries,
		"key_len":     len(key),
		"key_matches": key == in.Expect,
		"config_keys": keys(all["__config"]),
		"config_get":  configGet,
	}
	b, _ := json.Marshal(out)
	return tool.Result{Success: true, Output: string(b)}, nil
}

func keys(v any) []string {
	m, _ := v.(map[string]any)
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func init() { tool.Register(greeter{}) }

func main() {}
