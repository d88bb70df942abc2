package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ConfigSchema is a validated, compiled config_schema.
type ConfigSchema struct {
	compiled *jsonschema.Schema
	types    map[string]string // top-level property -> JSON type
	secrets  map[string]bool   // top-level string properties marked x-secret
}

// draft2020 is the only $schema a config_schema may name.
const draft2020 = "https://json-schema.org/draft/2020-12/schema"

var propTypes = map[string]bool{"string": true, "boolean": true, "integer": true, "number": true, "array": true, "object": true}

// CompileSchema checks the rules of seed 003 and compiles the schema as
// Draft 2020-12: the root is an object with a properties map and
// additionalProperties false; every top-level property declares one of
// string, boolean, integer, number, array or object, directly or through a
// local JSON pointer; x-secret may only be true, only on a direct top-level
// string property.
func CompileSchema(raw map[string]any) (*ConfigSchema, error) {
	// The compiler, the secret check and the JSON round trip each walk
	// the schema once per level below; bound the levels first.
	if deeper(raw, MaxNesting) {
		return nil, fieldErr(fieldConfigSchema, "nests deeper than %d levels", MaxNesting)
	}
	// Round-trip through JSON so TOML's int64 and nested tables become
	// plain JSON values.
	js, err := json.Marshal(raw)
	if err != nil {
		return nil, fieldErr(fieldConfigSchema, "%v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return nil, fieldErr(fieldConfigSchema, "%v", err)
	}
	root, _ := doc.(map[string]any)
	if s, ok := root["$schema"]; ok && s != draft2020 {
		return nil, fieldErr(fieldConfigSchema+".$schema", "must be %s when present", draft2020)
	}
	if root["type"] != "object" {
		return nil, fieldErr(fieldConfigSchema+".type", "the root must have type object")
	}
	if root["additionalProperties"] != false {
		return nil, fieldErr(fieldConfigSchema+".additionalProperties", "must be false")
	}
	props, ok := root["properties"].(map[string]any)
	if !ok {
		return nil, fieldErr(fieldConfigSchema+".properties", "must be a table of property schemas")
	}
	s := &ConfigSchema{types: map[string]string{}, secrets: map[string]bool{}}
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		field := fieldConfigSchema + ".properties." + name
		pm, ok := props[name].(map[string]any)
		if !ok {
			return nil, fieldErr(field, "is not a schema object")
		}
		typ, direct, err := propertyType(root, pm)
		if err != nil {
			return nil, fieldErr(field, "%v", err)
		}
		s.types[name] = typ
		if v, has := pm["x-secret"]; has {
			if v != true {
				return nil, fieldErr(field+".x-secret", "must be true or absent")
			}
			if !direct || typ != "string" {
				return nil, fieldErr(field+".x-secret", "only a direct top-level string property may be secret")
			}
			s.secrets[name] = true
		}
		if at := nestedSecret(pm, true, ""); at != "" {
			return nil, fieldErr(field+"."+at, "nested x-secret markers are not allowed")
		}
	}
	// A marker outside the properties (in $defs, say) is nested too.
	for k, v := range root {
		if k == "properties" {
			continue
		}
		if at := nestedSecret(map[string]any{k: v}, false, ""); at != "" {
			return nil, fieldErr(fieldConfigSchema+"."+at, "nested x-secret markers are not allowed")
		}
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("config_schema.json", doc); err != nil {
		return nil, fieldErr(fieldConfigSchema, "%v", err)
	}
	if s.compiled, err = c.Compile("config_schema.json"); err != nil {
		return nil, fieldErr(fieldConfigSchema, "is not a valid JSON Schema 2020-12: %v", err)
	}
	return s, nil
}

// deeper reports whether v nests tables and arrays more than limit levels
// deep, without walking further than that.
func deeper(v any, limit int) bool {
	if limit < 0 {
		return true
	}
	switch x := v.(type) {
	case map[string]any:
		for _, child := range x {
			if deeper(child, limit-1) {
				return true
			}
		}
	case []any:
		for _, child := range x {
			if deeper(child, limit-1) {
				return true
			}
		}
	case []map[string]any:
		for _, child := range x {
			if deeper(child, limit-1) {
				return true
			}
		}
	}
	return false
}

// propertyType returns the declared type of a top-level property, following
// one local $ref. direct is false when the type came through $ref.
func propertyType(root, p map[string]any) (typ string, direct bool, err error) {
	if t, ok := p["type"].(string); ok {
		if !propTypes[t] {
			return "", false, fmt.Errorf("type %q is not allowed", t)
		}
		return t, true, nil
	}
	ref, ok := p["$ref"].(string)
	if !ok || !strings.HasPrefix(ref, "#/") {
		return "", false, fmt.Errorf("must declare a type or a local $ref")
	}
	var cur any = root
	for _, part := range strings.Split(ref[2:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, fmt.Errorf("$ref %q does not resolve", ref)
		}
		cur = m[part]
	}
	target, ok := cur.(map[string]any)
	if !ok {
		return "", false, fmt.Errorf("$ref %q does not resolve", ref)
	}
	t, ok := target["type"].(string)
	if !ok || !propTypes[t] {
		return "", false, fmt.Errorf("$ref %q has no allowed type", ref)
	}
	return t, false, nil
}

// nestedSecret returns the path (relative to v) of an x-secret key below
// the top level of v, or "" when there is none.
func nestedSecret(v any, top bool, at string) string {
	join := func(k string) string {
		if at == "" {
			return k
		}
		return at + "." + k
	}
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "x-secret" && !top {
				return join(k)
			}
			if p := nestedSecret(x[k], false, join(k)); p != "" {
				return p
			}
		}
	case []any:
		for i, child := range x {
			if p := nestedSecret(child, false, fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	}
	return ""
}

// IsSecret reports whether name is a secret property.
func (s *ConfigSchema) IsSecret(name string) bool { return s != nil && s.secrets[name] }

// Materialize turns operator strings into typed JSON values by the schema's
// property types, validates the whole object, and partitions it exactly
// once: public (every non-secret property) and secrets (x-secret strings).
// Strings are taken as they are; booleans and numbers from JSON scalar text;
// arrays and objects from JSON text. Unknown keys, malformed encodings and
// constraint violations are refused; error messages name the property, never
// its value.
func (s *ConfigSchema) Materialize(values map[string]string) (public map[string]any, secrets map[string]string, err error) {
	obj := make(map[string]any, len(values))
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		typ, ok := s.types[k]
		if !ok {
			return nil, nil, fmt.Errorf("%w: unknown property %q", ErrConfig, k)
		}
		v, err := decodeValue(typ, values[k])
		if err != nil {
			return nil, nil, fmt.Errorf("%w: property %q is not a valid %s", ErrConfig, k, typ)
		}
		obj[k] = v
	}
	if err := s.compiled.Validate(obj); err != nil {
		var ve *jsonschema.ValidationError
		loc := ""
		if ok := asValidationError(err, &ve); ok && len(ve.Causes) > 0 {
			loc = strings.Join(ve.Causes[0].InstanceLocation, "/")
		}
		return nil, nil, fmt.Errorf("%w: config does not satisfy the schema at %q", ErrConfig, loc)
	}
	public = make(map[string]any, len(obj))
	secrets = map[string]string{}
	for k, v := range obj {
		if s.secrets[k] {
			secrets[k] = v.(string)
			continue
		}
		public[k] = v
	}
	return public, secrets, nil
}

func asValidationError(err error, ve **jsonschema.ValidationError) bool {
	v, ok := err.(*jsonschema.ValidationError)
	if ok {
		*ve = v
	}
	return ok
}

func decodeValue(typ, raw string) (any, error) {
	switch typ {
	case "string":
		return raw, nil
	case "boolean":
		return strconv.ParseBool(strings.TrimSpace(raw))
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(raw))
	if err != nil {
		return nil, err
	}
	switch typ {
	case "integer", "number":
		if _, ok := v.(json.Number); !ok {
			return nil, fmt.Errorf("not a number")
		}
	case "array":
		if _, ok := v.([]any); !ok {
			return nil, fmt.Errorf("not an array")
		}
	case "object":
		if _, ok := v.(map[string]any); !ok {
			return nil, fmt.Errorf("not an object")
		}
	}
	return v, nil
}
