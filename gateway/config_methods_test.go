package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
)

// Integer limits are read as integers: a number a float64 would round
// (2^53+1 is 2^53 as a float64, within call_fuel's maximum) is refused
// with -32602 naming the property, in config/set and in each set-many
// entry, before anything reaches the config service.
func TestConfigValuesAreExact(t *testing.T) {
	g := &Gateway{}
	ctx := context.Background()
	for _, tc := range []struct {
		method, params, want string
	}{
		{"config/set", `{"prop":"plugins.limits.call_fuel","value":9007199254740993}`,
			"Invalid params: `plugins.limits.call_fuel`: number cannot be held exactly: 9007199254740993 is not a float64"},
		{"config/set", `{"prop":"agents.x.tools","value":{"n":[1,18446744073709551615]}}`,
			"Invalid params: `agents.x.tools`: at n[1]: number cannot be held exactly"},
		{"config/set", `{"prop":"plugins.limits.call_fuel","value":1e400}`,
			"Invalid params: `plugins.limits.call_fuel`: number cannot be held exactly: 1e400 is beyond the range"},
		{"config/set-many", `{"sets":[{"prop":"rpc.max_local_connections","value":64},{"prop":"plugins.limits.call_fuel","value":9007199254740993}]}`,
			"Invalid params: sets[1]: `plugins.limits.call_fuel`: number cannot be held exactly"},
	} {
		var err error
		switch tc.method {
		case "config/set":
			_, err = g.configSet(ctx, nil, json.RawMessage(tc.params))
		case "config/set-many":
			_, err = g.configSetMany(ctx, nil, json.RawMessage(tc.params))
		}
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInvalidParams || !strings.HasPrefix(re.Message, tc.want) {
			t.Errorf("%s %s: %v, want -32602 %q", tc.method, tc.params, err, tc.want)
		}
	}
}
