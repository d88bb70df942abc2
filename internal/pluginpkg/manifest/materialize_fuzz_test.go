package manifest_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// FuzzMaterialize feeds a plugin's config_schema (TOML after the
// [config_schema] header, from the plugin's author) and an operator's
// value (plugins.entries.<key>.config) to Parse and Materialize: no panic;
// a refusal wraps ErrConfig and never repeats the value; an accepted
// config is partitioned once, secrets only for x-secret properties, and
// its public part marshals as JSON.
func FuzzMaterialize(f *testing.F) {
	const head = base + `permissions = ["config_read"]` + "\n[config_schema]\n"
	seedSchema := strings.TrimPrefix(schema, "\n[config_schema]\n")
	for _, s := range []struct{ schema, key, value string }{
		{seedSchema, "greeting", "hi"},
		{seedSchema, "retries", "4"},
		{seedSchema, "retries", "-1"},
		{seedSchema, "retries", "1e999"},
		{seedSchema, "tags", `["a","b"]`},
		{seedSchema, "tags", `{"not":"array"}`},
		{seedSchema, "api_key", "sk-secret-value"},
		{seedSchema, "nope", "x"},
		{"type = \"object\"\nadditionalProperties = false\n[properties.n]\ntype = \"number\"\nmultipleOf = 0.1\n", "n", "1e308"},
		{"type = \"object\"\nadditionalProperties = false\n[properties.s]\ntype = \"string\"\npattern = \"^(a+)+$\"\n", "s", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"},
		{"type = \"object\"\nadditionalProperties = false\n[properties.o]\n\"$ref\" = \"#/$defs/o\"\n[\"$defs\".o]\ntype = \"object\"\n[\"$defs\".o.properties.o]\n\"$ref\" = \"#/$defs/o\"\n", "o", `{"o":{"o":{"o":{}}}}`},
		{"type = \"object\"\nadditionalProperties = false\n[properties.b]\ntype = \"boolean\"\n", "b", " TRUE "},
	} {
		f.Add(s.schema, s.key, s.value)
	}
	f.Fuzz(func(t *testing.T, sch, key, value string) {
		m, err := manifest.Parse([]byte(head + sch))
		if err != nil || m.Schema() == nil {
			return
		}
		pub, sec, err := m.Schema().Materialize(map[string]string{key: value})
		if err != nil {
			if !errors.Is(err, manifest.ErrConfig) {
				t.Fatalf("refusal %v is not ErrConfig", err)
			}
			if len(value) >= 6 && !strings.Contains(key, value) && !strings.Contains(sch, value) && strings.Contains(err.Error(), value) {
				t.Fatalf("refusal %q repeats the value %q", err, value)
			}
			return
		}
		if len(pub)+len(sec) != 1 {
			t.Fatalf("one value partitioned as %v and %d secrets", pub, len(sec))
		}
		if _, ok := sec[key]; ok != m.Schema().IsSecret(key) {
			t.Fatalf("%q: secret %v, IsSecret %v", key, ok, m.Schema().IsSecret(key))
		}
		if _, err := json.Marshal(pub); err != nil {
			t.Fatalf("public config %v does not marshal: %v", pub, err)
		}
	})
}
