package configschema

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/jsonexact"
)

// fuzzPaths are the schema's rows with every "*" named, the paths a
// write can name.
func fuzzPaths() []string {
	var out []string
	for _, p := range Sorted() {
		out = append(out, strings.ReplaceAll(p, "*", "k"))
	}
	return out
}

var fuzzValues = []string{
	"64", "0", "1.5", "-0", "1e3", "9007199254740993", "1e400", "many", "true", "yes",
	`"quoted"`, `"\u0000"`, "a, b,,c", `["x"]`, `[1]`, `{"a":"b"}`, `{"a":1}`, "null",
	"ftp://x", "Config:Update,files:create", "agents.*.model,*", "agents..model",
	"caf\xe9", "[\"caf\xe9\"]", "10.0.0.0/8", "  ", "",
}

// FuzzParseText checks a value typed for a path (--set, clawmesh config
// set, the launcher's overrides): a refusal is one of the package's
// errors, and an accepted value is canonical (Check gives it back), and
// reads back the same after the trip a write makes (JSON, a protobuf
// Value, the config service's Check, the stored document).
func FuzzParseText(f *testing.F) {
	for i, p := range fuzzPaths() {
		f.Add(p, fuzzValues[i%len(fuzzValues)])
	}
	for _, v := range fuzzValues {
		f.Add("agents.default.tools", v)
		f.Add("rpc.max_frame_bytes", v)
	}
	f.Fuzz(func(t *testing.T, path, raw string) {
		v, err := ParseText(path, raw)
		if err != nil {
			if !errors.Is(err, ErrType) && !errors.Is(err, ErrUnknown) && !errors.Is(err, ErrNotLeaf) && !errors.Is(err, jsonexact.ErrInexact) {
				t.Fatalf("ParseText(%q, %q): %v is none of the package's errors", path, raw, err)
			}
			return
		}
		p, err := LookupLeaf(path)
		if err != nil {
			t.Fatalf("ParseText(%q) accepted a path LookupLeaf refuses: %v", path, err)
		}
		checkCanonical(t, path, p, v)
	})
}

// FuzzCheck checks a JSON value sent for a path on the socket (config/set:
// jsonexact, then a protobuf Value to the config service, which checks it
// with Check): no panic, a refusal is ErrType, an accepted value is
// canonical and a document holding it normalizes and validates without
// panicking.
func FuzzCheck(f *testing.F) {
	for i, p := range fuzzPaths() {
		f.Add(p, fuzzValues[i%len(fuzzValues)])
	}
	f.Fuzz(func(t *testing.T, path, raw string) {
		p, err := LookupLeaf(path)
		if err != nil {
			return
		}
		dec, err := jsonexact.Decode([]byte(raw))
		if err != nil {
			return
		}
		pv, err := structpb.NewValue(dec)
		if err != nil {
			return
		}
		v, err := p.Check(pv.AsInterface())
		if err != nil {
			if !errors.Is(err, ErrType) {
				t.Fatalf("Check(%q, %s): %v is not ErrType", path, raw, err)
			}
			return
		}
		checkCanonical(t, path, p, v)
	})
}

func checkCanonical(t *testing.T, path string, p *Property, v any) {
	t.Helper()
	again, err := p.Check(v)
	if err != nil || !reflect.DeepEqual(again, v) {
		t.Fatalf("%s: Check of the canonical %#v gives %#v, %v", path, v, again, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %#v does not marshal: %v", path, v, err)
	}
	dec, err := jsonexact.Decode(b)
	if err != nil {
		t.Fatalf("%s: %s does not decode: %v", path, b, err)
	}
	pv, err := structpb.NewValue(dec)
	if err != nil {
		t.Fatalf("%s: %s is no protobuf value: %v", path, b, err)
	}
	sent, err := p.Check(pv.AsInterface())
	if err != nil || !reflect.DeepEqual(sent, v) {
		t.Fatalf("%s: %#v sent as %s reads back %#v, %v", path, v, b, sent, err)
	}
	doc := map[string]any{}
	if err := Set(doc, path, v); err != nil {
		t.Fatalf("Set(%s): %v", path, err)
	}
	norm, err := Normalize(doc)
	if err != nil {
		t.Fatalf("%s: a document holding %#v does not normalize: %v", path, v, err)
	}
	if got, ok := Get(norm, path); !ok || !reflect.DeepEqual(got, v) {
		t.Fatalf("%s: normalized %#v reads %#v", path, v, got)
	}
	_ = Validate(Effective(norm))
	_ = Mask(norm)
}
