package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configschema"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// configWrite calls config/set or config/set-many on g with params, as
// the connection's handler would with no principal bound.
func configWrite(g *Gateway, method, params string) error {
	var err error
	switch method {
	case "config/set":
		_, err = g.configSet(context.Background(), nil, json.RawMessage(params))
	case "config/set-many":
		_, err = g.configSetMany(context.Background(), nil, json.RawMessage(params))
	}
	return err
}

// Integer limits are read as integers: a number a float64 would round
// (2^53+1 is 2^53 as a float64, within call_fuel's maximum) is refused
// with -32602 naming the property, in config/set and in each set-many
// entry, before anything reaches the config service.
func TestConfigValuesAreExact(t *testing.T) {
	g := &Gateway{}
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
		err := configWrite(g, tc.method, tc.params)
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInvalidParams || !strings.HasPrefix(re.Message, tc.want) {
			t.Errorf("%s %s: %v, want -32602 %q", tc.method, tc.params, err, tc.want)
		}
	}
}

// A key given twice, in two spellings encoding/json reads as one field,
// is refused like any repeated key: otherwise the last would win unseen,
// in config/set and in each set-many entry.
func TestConfigWriteRefusesKeysEqualButForCase(t *testing.T) {
	g := &Gateway{}
	for _, tc := range []struct {
		method, params, want string
	}{
		{"config/set", `{"prop":"agents.default.provider","PROP":"rpc.max_local_connections","value":1}`,
			"Invalid params: `PROP` appears twice"},
		{"config/set-many", `{"sets":[{"prop":"agents.default.provider","value":"x"},{"prop":"rpc.max_local_connections","Prop":"agents.default.provider","value":1}]}`,
			"Invalid params: `sets[1].Prop` appears twice"},
		{"config/set-many", "{\"sets\":[{\"prop\":\"rpc.max_local_connections\",\"value\":64,\"VALUE\":65}]}",
			"Invalid params: `sets[0].VALUE` appears twice"},
	} {
		err := configWrite(g, tc.method, tc.params)
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInvalidParams || re.Message != tc.want {
			t.Errorf("%s %s: %v, want -32602 %q", tc.method, tc.params, err, tc.want)
		}
	}
}

// JSON is UTF-8: a value with bytes that are not (Latin-1 text) was read
// with U+FFFD in their place and stored so, answered set:true. It is
// refused, naming the entry, before the config service is asked.
func TestConfigValuesAreUTF8(t *testing.T) {
	g := &Gateway{}
	for _, tc := range []struct {
		method, params, want string
	}{
		{"config/set", "{\"prop\":\"agents.default.system_prompt\",\"value\":\"caf\xe9\"}",
			"Invalid params: `value` of `agents.default.system_prompt` is not UTF-8 text"},
		{"config/set", "{\"prop\":\"plugins.entries.k.config\",\"value\":{\"caf\xe9\":\"x\"}}",
			"Invalid params: `value` of `plugins.entries.k.config` is not UTF-8 text"},
		{"config/set-many", "{\"sets\":[{\"prop\":\"agents.default.model\",\"value\":\"m\"},{\"prop\":\"agents.default.model\",\"value\":\"\xff\"}]}",
			"Invalid params: sets[1]: `value` of `agents.default.model` is not UTF-8 text"},
	} {
		err := configWrite(g, tc.method, tc.params)
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInvalidParams || re.Message != tc.want {
			t.Errorf("%s %q: %v, want -32602 %q", tc.method, tc.params, err, tc.want)
		}
	}
}

// A config write was decoded before the config service was asked: 8 MiB
// of "1," became 80 bytes of memory for every two of JSON (910 MiB for one
// frame, the gateway's resident set 20 MiB → 3 GiB for six), whoever sent
// it. A write larger than a config document, or carrying more than
// maxWriteValues values, is refused before it is decoded.
func TestConfigWriteBoundedBeforeDecoding(t *testing.T) {
	g := &Gateway{}
	ones := "[" + strings.Repeat("1,", maxWriteValues) + "1]"
	huge := `"` + strings.Repeat("x", configschema.MaxDocumentBytes) + `"`
	for _, tc := range []struct {
		method, params, want string
	}{
		{"config/set", `{"prop":"agents.default.tools","value":` + ones + `}`,
			"Invalid params: `value` holds 16386 JSON values or more, more than a config write may carry; the limit is 16384"},
		{"config/set", `{"prop":"agents.default.system_prompt","value":` + huge + `}`,
			"Invalid params: `value` is 4194306 bytes, more than a config document may be; the limit is 4194304"},
		{"config/set-many", `{"sets":[{"prop":"agents.default.tools","value":` + ones + `}]}`,
			"Invalid params: `sets` holds"},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := configWrite(g, tc.method, tc.params)
		runtime.ReadMemStats(&after)
		var re *jsonrpc.Error
		if !errors.As(err, &re) || re.Code != jsonrpc.CodeInvalidParams || !strings.HasPrefix(re.Message, tc.want) {
			t.Fatalf("%s: %v, want -32602 %q", tc.method, err, tc.want)
		}
		// The params are read as raw JSON, a copy; nothing is decoded.
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 3*uint64(len(tc.params)) {
			t.Fatalf("%s: %d bytes allocated for %d of params", tc.method, grew, len(tc.params))
		}
	}
	if n := jsonValues([]byte(`{"a":[1,"x,[{"],"b":{"c":"\"{"}}`)); n != 6 {
		t.Fatalf("values counted in strings: %d", n)
	}
}

// deletingConfig answers every Delete as done.
type deletingConfig struct {
	configv1.UnimplementedConfigServiceServer
}

func (deletingConfig) Delete(_ context.Context, req *configv1.DeleteRequest) (*configv1.DeleteResponse, error) {
	return &configv1.DeleteResponse{Prop: req.GetProp()}, nil
}

// Deleting a property the stack reads only at start returns it to its
// default at the next restart, as setting it does; config/set said so
// (requires_restart, the CLI's note) and config/delete did not, so the
// operator took the default to be in force.
func TestConfigDeleteSaysWhenItWaitsForARestart(t *testing.T) {
	g := &Gateway{config: configv1.NewConfigServiceClient(serveFake(t, func(s *grpc.Server) {
		configv1.RegisterConfigServiceServer(s, deletingConfig{})
	})), monitor: newMonitor(time.Hour, zap.NewNop())}
	for prop, want := range map[string]any{
		"rpc.max_local_connections": []string{"rpc.max_local_connections"},
		"agents.default.model":      nil,
		"users.alice":               nil,
	} {
		res, err := g.configDelete(context.Background(), &connState{}, json.RawMessage(`{"prop":"`+prop+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		m := res.(map[string]any)
		if got := m["requires_restart"]; !reflect.DeepEqual(got, want) {
			t.Errorf("config/delete %s: requires_restart %v, want %v", prop, got, want)
		}
		if m["deleted"] != true || m["prop"] != prop {
			t.Errorf("config/delete %s: %v", prop, m)
		}
	}
}
