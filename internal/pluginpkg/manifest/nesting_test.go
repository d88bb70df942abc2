package manifest_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// allocBound is what parsing any one manifest may allocate. It is far above
// what a real manifest costs (tens of KiB) and far below what the nesting
// bombs cost without the bounds (hundreds of MiB to gigabytes).
const allocBound = 64 << 20

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

const toolWithSchema = "name = \"p\"\nversion = \"1.0.0\"\nwasm_path = \"p.wasm\"\ncapabilities = [\"tool\"]\npermissions = [\"config_read\"]\n"

// nestedSchema is a config_schema of depth object properties, each
// holding the next.
func nestedSchema(depth int) string {
	return "config_schema = {type=\"object\",additionalProperties=false,properties={a=" +
		strings.Repeat("{type=\"object\",properties={a=", depth) + "{type=\"string\"}" + strings.Repeat("}}", depth) + "}}\n"
}

// TestParseRefusesNestingBombs: documents a few KiB long that nest deeply
// are refused before the TOML decoder sees them, naming the line, and
// cheaply: the decoder is quadratic in each of these shapes.
func TestParseRefusesNestingBombs(t *testing.T) {
	cases := []struct{ name, doc, line string }{
		{"arrays", "name = \"p\"\nx = " + strings.Repeat("[", 12000) + strings.Repeat("]", 12000) + "\n", "line 2"},
		{"inline tables", "x = " + strings.Repeat("{a=", 4000) + "1" + strings.Repeat("}", 4000) + "\n", "line 1"},
		{"arrays of inline tables", "x = " + strings.Repeat("[{a=", 3000) + "1" + strings.Repeat("}]", 3000) + "\n", "line 1"},
		{"dotted key", strings.Repeat("a.", 8000) + "a = 1\n", "line 1"},
		{"quoted dotted key", strings.Repeat(`"a".`, 8000) + "a = 1\n", "line 1"},
		{"dotted key in an inline table", "x = {" + strings.Repeat("a.", 8000) + "a = 1}\n", "line 1"},
		{"table header", "# a comment\n[" + strings.Repeat("a.", 8000) + "a]\n", "line 2"},
		{"array of tables header", "[[" + strings.Repeat("a.", 8000) + "a]]\n", "line 1"},
		{"config_schema", toolWithSchema + nestedSchema(400), "line 6"},
		{"header, dotted key and inline tables together", "[" + strings.Repeat("a.", 12) + "a]\n" + strings.Repeat("b.", 12) + "b = " + strings.Repeat("{c=", 12) + "1" + strings.Repeat("}", 12) + "\n", "line 2"},
		{"array of tables header, then a dotted key", "[[" + strings.Repeat("a.", 20) + "a]]\n" + strings.Repeat("b.", 20) + "b = 1\n", "line 2"},
		{"after a multi-line string", "description = \"\"\"\n[\n\n\"\"\"\nx = " + strings.Repeat("{a=", 4000) + "1" + strings.Repeat("}", 4000) + "\n", "line 5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = manifest.Parse([]byte(c.doc)) })
			var fe *manifest.FieldError
			if !errors.As(err, &fe) || fe.Field != "manifest" || !strings.Contains(err.Error(), c.line+":") {
				t.Errorf("err = %v, want a refusal of the manifest at %s", err, c.line)
			}
			t.Logf("%d bytes: %d KiB allocated", len(c.doc), n>>10)
			if n > allocBound {
				t.Errorf("refusing a %d-byte manifest allocated %d MiB", len(c.doc), n>>20)
			}
		})
	}
}

// TestParseNestingWithinBounds: brackets, braces and dots inside strings
// and comments do not count, and nesting up to the bound is accepted.
func TestParseNestingWithinBounds(t *testing.T) {
	deepString := strings.Repeat("[{.", 100)
	cases := []struct{ name, doc, field string }{
		{"basic string", `description = "` + deepString + `\"` + deepString + `"`, ""},
		{"literal string", `description = '` + deepString + `'`, ""},
		{"multi-line basic string", "description = \"\"\"\n" + deepString + "\n\\\"\"\"" + deepString + "\"\"\"\"", ""},
		{"multi-line literal string", "description = '''\n" + deepString + "\n''" + deepString + "''''", ""},
		{"comment", "# " + deepString + "\ndescription = \"d\" # " + deepString, ""},
		{"quoted key", `x."` + deepString + `" = 1`, "x"},
		{"arrays at the bound", "x = " + strings.Repeat("[", manifest.MaxNesting) + strings.Repeat("]", manifest.MaxNesting), "x"},
		{"dotted key at the bound", "x" + strings.Repeat(".a", manifest.MaxNesting-1) + " = 1.5", "x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A valid manifest, or one refused for its unknown field x
			// only: the decoder accepted it.
			doc := "name = \"s\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n" + c.doc + "\n"
			_, err := manifest.Parse([]byte(doc))
			var fe *manifest.FieldError
			switch {
			case c.field == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
				t.Fatalf("err = %v, want a refusal of the unknown field %s", err, c.field)
			}
		})
	}
}

// TestCompileSchemaRefusesDeepSchema: a config_schema nesting past the
// bound is refused by field before the compiler walks it.
func TestCompileSchemaRefusesDeepSchema(t *testing.T) {
	leaf := map[string]any{"type": "string"}
	for range 1000 {
		leaf = map[string]any{"type": "object", "properties": map[string]any{"a": leaf}}
	}
	raw := map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{"a": leaf}}
	var err error
	n := allocated(func() { _, err = manifest.CompileSchema(raw) })
	var fe *manifest.FieldError
	if !errors.As(err, &fe) || fe.Field != "config_schema" {
		t.Fatalf("err = %v, want a refusal of config_schema", err)
	}
	if n > allocBound {
		t.Fatalf("refusing a schema 1000 levels deep allocated %d MiB", n>>20)
	}
}

// TestParseDeepValidSchemaIsCheap: the deepest config_schema the bounds
// let through is accepted at a bounded cost.
func TestParseDeepValidSchemaIsCheap(t *testing.T) {
	depth := manifest.MaxNesting/2 - 2 // two braces a level, plus the root's two
	doc := toolWithSchema + nestedSchema(depth)
	var err error
	n := allocated(func() { _, err = manifest.Parse([]byte(doc)) })
	if err != nil {
		t.Fatalf("a schema %d levels deep: %v", depth, err)
	}
	if n > allocBound {
		t.Fatalf("parsing a %d-byte manifest allocated %d MiB", len(doc), n>>20)
	}
}

// TestParseValueErrorNamesPath: the path of a refused value is still
// named in full now that it is built only on refusal.
func TestParseValueErrorNamesPath(t *testing.T) {
	doc := "name = \"s\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n[x.\"a.b\"]\ny = [1, {z = [nan]}]\n"
	_, err := manifest.Parse([]byte(doc))
	var fe *manifest.FieldError
	if !errors.As(err, &fe) || fe.Field != `x."a.b".y[1].z[0]` {
		t.Fatalf("err = %v, want a refusal of x.\"a.b\".y[1].z[0]", err)
	}
}
