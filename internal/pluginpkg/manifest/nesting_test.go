package manifest_test

import (
	"errors"
	"fmt"
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

// shape is a document of a head, count lines and a tail.
type shape struct {
	head string
	line func(i int) string
	tail string
}

// doc returns the shape with count lines, or ok false past MaxBytes.
func (sh shape) doc(count int) (doc string, ok bool) {
	var b strings.Builder
	b.WriteString(sh.head)
	for i := range count {
		b.WriteString(sh.line(i))
		if b.Len()+len(sh.tail) > manifest.MaxBytes {
			return "", false
		}
	}
	return b.String() + sh.tail, true
}

// refused reports whether Parse refused doc as a whole before decoding.
func refused(doc string) bool {
	_, err := manifest.Parse([]byte(doc))
	var fe *manifest.FieldError
	return errors.As(err, &fe) && fe.Field == "manifest"
}

// TestParseBoundsDecoderCost: documents of up to MaxBytes that stay
// within MaxNesting still cost the TOML decoder time and memory in the
// depth and the length of their keys, for every key: a key's full path
// is joined into strings several times, and once per prefix for a dotted
// key. For each shape, the most lines the bound lets through (or as many
// as fit in MaxBytes) decode within allocBound. Before the bound, 256 KiB
// of 31-part dotted keys took 310 MiB, and a 32 KiB table header with
// short keys under it 3.9 GiB.
func TestParseBoundsDecoderCost(t *testing.T) {
	d30 := strings.Repeat("a.", 30)
	long := strings.Repeat("a", 1024)
	shapes := map[string]shape{
		"dotted keys 31 deep":          {"", func(i int) string { return fmt.Sprintf("%sk%d=1\n", d30, i) }, ""},
		"dotted keys in inline tables": {"x = [", func(int) string { return "{" + d30 + "a=1}," }, "]\n"},
		"inline tables 15 deep":        {"x = [", func(int) string { return strings.Repeat("{a=", 15) + "1" + strings.Repeat("}", 15) + "," }, "]\n"},
		"dotted keys of long parts": {"", func(i int) string {
			return strings.Repeat(strings.Repeat("a", 256)+".", 30) + fmt.Sprintf("k%d=1\n", i)
		}, ""},
		"long table header, many keys": {"[" + strings.Repeat(long+".", 30) + long + "]\n", func(i int) string { return fmt.Sprintf("k%d=1\n", i) }, ""},
		"long header part, many keys":  {"[" + strings.Repeat("a", 8000) + "]\n", func(i int) string { return fmt.Sprintf("k%d=1\n", i) }, ""},
		"long inline key, many keys":   {"x = {" + strings.Repeat(long+".", 7) + long + "={", func(i int) string { return fmt.Sprintf("k%d=1,", i) }, "z=1}}\n"},
		"headers 31 deep":              {"", func(i int) string { return fmt.Sprintf("[%sk%d]\n", d30, i) }, ""},
		"short keys":                   {"", func(i int) string { return fmt.Sprintf("k%d=1\n", i) }, ""},
	}
	for name, sh := range shapes {
		t.Run(name, func(t *testing.T) {
			// The most lines that fit and are not refused.
			lo, hi := 0, 1
			for {
				d, ok := sh.doc(hi)
				if !ok || refused(d) {
					break
				}
				lo, hi = hi, hi*2
			}
			for hi-lo > 1 {
				mid := (lo + hi) / 2
				if d, ok := sh.doc(mid); ok && !refused(d) {
					lo = mid
				} else {
					hi = mid
				}
			}
			doc, _ := sh.doc(lo)
			n := allocated(func() { _, _ = manifest.Parse([]byte(doc)) })
			t.Logf("%d lines, %d bytes let through: %d KiB allocated", lo, len(doc), n>>10)
			if n > allocBound {
				t.Errorf("a %d-byte manifest allocated %d MiB", len(doc), n>>20)
			}
			if over, ok := sh.doc(lo + 1); ok {
				_, err := manifest.Parse([]byte(over))
				if !strings.Contains(fmt.Sprint(err), "too many keys") {
					t.Errorf("one line more: %v", err)
				}
			}
		})
	}
}

// TestParseManyRealKeysAccepted: a large manifest of the kind a plugin
// may really have, a config_schema of 500 properties each described by a
// table, is well within the keys' cost bound.
func TestParseManyRealKeysAccepted(t *testing.T) {
	var b strings.Builder
	b.WriteString(toolWithSchema + "[config_schema]\ntype = \"object\"\nadditionalProperties = false\n")
	for i := range 500 {
		fmt.Fprintf(&b, "[config_schema.properties.option_number_%d]\ntype = \"string\"\ndescription = \"option %d\"\nmaxLength = 64\n", i, i)
	}
	if _, err := manifest.Parse([]byte(b.String())); err != nil {
		t.Fatalf("%d bytes: %v", b.Len(), err)
	}
}
