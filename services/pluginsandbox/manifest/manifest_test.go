package manifest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/manifest"
)

const base = `
name = "greeter"
version = "0.1.0"
wasm_path = "plugin.wasm"
capabilities = ["tool"]
`

const schema = `
[config_schema]
type = "object"
additionalProperties = false
[config_schema.properties.greeting]
type = "string"
[config_schema.properties.retries]
type = "integer"
minimum = 0
[config_schema.properties.tags]
type = "array"
[config_schema.properties.api_key]
type = "string"
x-secret = true
`

func TestParseRules(t *testing.T) {
	cases := []struct {
		name, toml string
		ok         bool
	}{
		{"minimal tool", base + `permissions = []`, true},
		{"config_read with schema", base + `permissions = ["config_read"]` + schema, true},
		{"config_read without schema", base + `permissions = ["config_read"]`, false},
		{"schema without config_read", base + schema, false},
		{"no capabilities", strings.Replace(base, `capabilities = ["tool"]`, `capabilities = []`, 1), false},
		{"unknown capability", strings.Replace(base, `"tool"`, `"teleport"`, 1), false},
		{"no wasm_path", strings.Replace(base, `wasm_path = "plugin.wasm"`, ``, 1), false},
		{"skill only without wasm", "name = \"s\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n", true},
		{"escaping wasm_path", strings.Replace(base, `plugin.wasm`, `../x.wasm`, 1), false},
		{"unknown key", base + `colour = "red"`, false},
		{"bad version", strings.Replace(base, `0.1.0`, `one`, 1), false},
		{"secret on a number", base + `permissions = ["config_read"]` + strings.Replace(schema, "type = \"string\"\nx-secret", "type = \"integer\"\nx-secret", 1), false},
		{"x-secret false", base + `permissions = ["config_read"]` + strings.Replace(schema, "x-secret = true", "x-secret = false", 1), false},
		{"additionalProperties missing", base + `permissions = ["config_read"]` + strings.Replace(schema, "additionalProperties = false\n", "", 1), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := manifest.Parse([]byte(c.toml))
			if (err == nil) != c.ok {
				t.Fatalf("err = %v, want ok=%v", err, c.ok)
			}
			if err != nil && !errors.Is(err, manifest.ErrInvalid) {
				t.Fatalf("err %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestMaterialize(t *testing.T) {
	m, err := manifest.Parse([]byte(base + `permissions = ["config_read"]` + schema))
	if err != nil {
		t.Fatal(err)
	}
	pub, sec, err := m.Schema().Materialize(map[string]string{"greeting": "hi", "retries": "4", "tags": `["a","b"]`, "api_key": "k"})
	if err != nil {
		t.Fatal(err)
	}
	if _, leaked := pub["api_key"]; leaked || sec["api_key"] != "k" || pub["greeting"] != "hi" || len(pub["tags"].([]any)) != 2 {
		t.Fatalf("public %v, secrets %v", pub, sec)
	}
	for _, bad := range []map[string]string{
		{"unknown": "x"},
		{"retries": "four"},
		{"retries": "-1"},
		{"tags": `{"not":"array"}`},
	} {
		if _, _, err := m.Schema().Materialize(bad); !errors.Is(err, manifest.ErrConfig) {
			t.Errorf("values %v: err = %v, want ErrConfig", bad, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(base + `permissions = ["config_read"]` + schema))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = manifest.Parse(b)
	})
}
