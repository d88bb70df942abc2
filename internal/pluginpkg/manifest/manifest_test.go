package manifest_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
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

// TestParseRules is the table of manifests, valid and invalid; every
// refusal must be a *FieldError naming the field at fault.
func TestParseRules(t *testing.T) {
	withRead := base + `permissions = ["config_read"]` + schema
	cases := []struct {
		name, toml string
		field      string // "" means valid
	}{
		{"minimal tool", base + `permissions = []`, ""},
		{"every field", base + "description = \"d\"\nauthor = \"a\"\n" + `permissions = ["config_read", "http_client"]` + schema, ""},
		{"config_read with schema", withRead, ""},
		{"prerelease and build", strings.Replace(base, `0.1.0`, `1.0.0-rc.1+build.5`, 1), ""},
		{"channel and tool", strings.Replace(base, `["tool"]`, `["tool", "channel"]`, 1), ""},
		{"inert permissions accepted", base + `permissions = ["file_read", "file_write", "memory_read", "memory_write"]`, ""},
		{"skill only without wasm", "name = \"s\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n", ""},
		{"config_read without schema", base + `permissions = ["config_read"]`, "permissions"},
		{"schema without config_read", base + schema, "config_schema"},
		{"no capabilities", strings.Replace(base, `capabilities = ["tool"]`, `capabilities = []`, 1), "capabilities"},
		{"capabilities missing", strings.Replace(base, `capabilities = ["tool"]`, ``, 1), "capabilities"},
		{"capabilities not a list", strings.Replace(base, `capabilities = ["tool"]`, `capabilities = "tool"`, 1), "capabilities"},
		{"capability not a string", strings.Replace(base, `capabilities = ["tool"]`, `capabilities = [1]`, 1), "capabilities[0]"},
		{"unknown capability", strings.Replace(base, `"tool"`, `"teleport"`, 1), "capabilities[0]"},
		{"capability twice", strings.Replace(base, `["tool"]`, `["tool", "tool"]`, 1), "capabilities[1]"},
		{"unknown permission", base + `permissions = ["root"]`, "permissions[0]"},
		{"permission twice", base + `permissions = ["http_client", "http_client"]`, "permissions[1]"},
		{"no wasm_path", strings.Replace(base, `wasm_path = "plugin.wasm"`, ``, 1), "wasm_path"},
		{"skill only with wasm", "name = \"s\"\nversion = \"1.0.0\"\nwasm_path = \"p.wasm\"\ncapabilities = [\"skill\"]\n", "wasm_path"},
		{"escaping wasm_path", strings.Replace(base, `plugin.wasm`, `../x.wasm`, 1), "wasm_path"},
		{"absolute wasm_path", strings.Replace(base, `plugin.wasm`, `/x.wasm`, 1), "wasm_path"},
		{"drive-letter wasm_path", strings.Replace(base, `plugin.wasm`, `C:x.wasm`, 1), "wasm_path"},
		{"backslash wasm_path", strings.Replace(base, `plugin.wasm`, `a\\x.wasm`, 1), "wasm_path"},
		{"unknown key", base + `colour = "red"`, "colour"},
		{"name missing", strings.Replace(base, `name = "greeter"`, ``, 1), "name"},
		{"name upper case", strings.Replace(base, `greeter`, `Greeter`, 1), "name"},
		{"name not a string", strings.Replace(base, `name = "greeter"`, `name = 7`, 1), "name"},
		{"bad version", strings.Replace(base, `0.1.0`, `one`, 1), "version"},
		{"leading-zero version", strings.Replace(base, `0.1.0`, `01.0.0`, 1), "version"},
		{"v-prefixed version", strings.Replace(base, `0.1.0`, `v1.0.0`, 1), "version"},
		{"two-part version", strings.Replace(base, `0.1.0`, `1.0`, 1), "version"},
		{"leading-zero prerelease", strings.Replace(base, `0.1.0`, `1.0.0-01`, 1), "version"},
		{"version missing", strings.Replace(base, `version = "0.1.0"`, ``, 1), "version"},
		{"description control character", base + `description = "a\u0007b"`, "description"},
		{"config_read on memory", strings.Replace(base, `["tool"]`, `["memory"]`, 1) + `permissions = ["config_read"]` + schema, "permissions"},
		{"schema not a table", base + `permissions = ["config_read"]` + "\nconfig_schema = 3\n", "config_schema"},
		{"secret on a number", base + `permissions = ["config_read"]` + strings.Replace(schema, "type = \"string\"\nx-secret", "type = \"integer\"\nx-secret", 1), "config_schema.properties.api_key.x-secret"},
		{"x-secret false", base + `permissions = ["config_read"]` + strings.Replace(schema, "x-secret = true", "x-secret = false", 1), "config_schema.properties.api_key.x-secret"},
		{"x-secret not boolean", base + `permissions = ["config_read"]` + strings.Replace(schema, "x-secret = true", `x-secret = "yes"`, 1), "config_schema.properties.api_key.x-secret"},
		{"nested x-secret", withRead + "[config_schema.properties.nested]\ntype = \"object\"\n[config_schema.properties.nested.properties.inner]\ntype = \"string\"\nx-secret = true\n", "config_schema.properties.nested.properties.inner.x-secret"},
		{"x-secret in $defs", withRead + "[config_schema.\"$defs\".s]\ntype = \"string\"\nx-secret = true\n", "config_schema.$defs.s.x-secret"},
		{"secret through $ref", withRead + "[config_schema.\"$defs\".s]\ntype = \"string\"\n[config_schema.properties.viaref]\n\"$ref\" = \"#/$defs/s\"\nx-secret = true\n", "config_schema.properties.viaref.x-secret"},
		{"untyped property", withRead + "[config_schema.properties.loose]\ndescription = \"no type\"\n", "config_schema.properties.loose"},
		{"property of type null", withRead + "[config_schema.properties.n]\ntype = \"null\"\n", "config_schema.properties.n"},
		{"additionalProperties missing", base + `permissions = ["config_read"]` + strings.Replace(schema, "additionalProperties = false\n", "", 1), "config_schema.additionalProperties"},
		{"additionalProperties true", base + `permissions = ["config_read"]` + strings.Replace(schema, "additionalProperties = false", "additionalProperties = true", 1), "config_schema.additionalProperties"},
		{"root not an object", base + `permissions = ["config_read"]` + strings.Replace(schema, "type = \"object\"", "type = \"array\"", 1), "config_schema.type"},
		{"properties missing", base + `permissions = ["config_read"]` + "\n[config_schema]\ntype = \"object\"\nadditionalProperties = false\n", "config_schema.properties"},
		{"explicit 2020-12 $schema", strings.Replace(withRead, "[config_schema]\n", "[config_schema]\n\"$schema\" = \"https://json-schema.org/draft/2020-12/schema\"\n", 1), ""},
		{"wrong $schema", strings.Replace(withRead, "[config_schema]\n", "[config_schema]\n\"$schema\" = \"http://json-schema.org/draft-07/schema#\"\n", 1), "config_schema.$schema"},
		{"datetime value", base + "description = 1979-05-27T07:32:00Z\n", "description"},
		{"nan in schema", withRead + "[config_schema.properties.f]\ntype = \"number\"\nmaximum = nan\n", "config_schema.properties.f.maximum"},
		{"signature without key", base + `signature = "` + strings.Repeat("A", 86) + `"`, "publisher_key"},
		{"key without signature", base + `publisher_key = "` + strings.Repeat("ab", 32) + `"`, "signature"},
		{"short key", base + `signature = "` + strings.Repeat("A", 86) + `"` + "\n" + `publisher_key = "abcd"`, "publisher_key"},
		{"signature not base64url", base + `signature = "` + strings.Repeat("+", 86) + `"` + "\n" + `publisher_key = "` + strings.Repeat("ab", 32) + `"`, "signature"},
		{"signature wrong length", base + `signature = "AAAA"` + "\n" + `publisher_key = "` + strings.Repeat("ab", 32) + `"`, "signature"},
		{"not toml", "name = ", "manifest"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := manifest.Parse([]byte(c.toml))
			if c.field == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var fe *manifest.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, manifest.ErrInvalid) {
				t.Fatalf("want a FieldError on %q, got %v (manifest %+v)", c.field, err, m)
			}
			if fe.Field != c.field {
				t.Fatalf("refused field %q (%v), want %q", fe.Field, err, c.field)
			}
		})
	}
}

// Declared-but-unenforced permissions are reported as granting nothing.
func TestInertPermissions(t *testing.T) {
	m, err := manifest.Parse([]byte(base + `permissions = ["http_client", "file_read", "memory_write"]`))
	if err != nil {
		t.Fatal(err)
	}
	got := m.Inert()
	if len(got) != 2 || got[0] != manifest.PermFileRead || got[1] != manifest.PermMemoryWrite {
		t.Fatalf("inert = %v", got)
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

// FuzzParse feeds arbitrary bytes to the manifest parser: it must never
// panic, every refusal must name a field, and an accepted manifest has
// stable canonical bytes that survive re-signing.
func FuzzParse(f *testing.F) {
	f.Add([]byte(base + `permissions = ["config_read"]` + schema))
	f.Add([]byte(base + "description = 1979-05-27T07:32:00Z\n"))
	f.Add([]byte("name = \"s\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n[[x]]\na = nan\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := manifest.Parse(b)
		if err != nil {
			var fe *manifest.FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("refusal without a field: %v", err)
			}
			return
		}
		if !bytes.Equal(m.CanonicalBytes(), m.CanonicalBytes()) {
			t.Fatal("canonical bytes are not deterministic")
		}
	})
}
