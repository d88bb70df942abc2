package gateway

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzConfigValue runs a config/set value (raw JSON from the socket)
// through the gateway's checks: no panic, jsonValues counts at least the
// values the accepted value holds (the bound on what one write may make
// the gateway decode), and an accepted value reads back as valid JSON.
func FuzzConfigValue(f *testing.F) {
	for _, s := range []string{
		`64`, `"quoted"`, `"caf\u00e9"`, `["a","b"]`, `{"a":"b","c":[1,{"d":null}]}`, `1e400`,
		`9007199254740993`, `[[[[[]]]]]`, `{"a\"":[",",",{"]}`, `"\\"`, `[1,]`, `"\xff"`, ``, `  null  `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if checkWriteSize(raw, "value") != nil {
			return
		}
		pv, err := configValue(raw, "value", "p")
		if err != nil {
			if pv != nil {
				t.Fatalf("configValue(%q): a value and %v", raw, err)
			}
			return
		}
		if n, bound := countValues(pv), jsonValues(raw); n > bound {
			t.Fatalf("configValue(%q) holds %d values, jsonValues counted %d", raw, n, bound)
		}
		b, err := json.Marshal(pv.AsInterface())
		if err != nil || !json.Valid(b) {
			t.Fatalf("configValue(%q) reads back as %q, %v", raw, b, err)
		}
	})
}

func countValues(v *structpb.Value) int {
	n := 1
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, it := range k.ListValue.GetValues() {
			n += countValues(it)
		}
	case *structpb.Value_StructValue:
		for _, it := range k.StructValue.GetFields() {
			n += countValues(it)
		}
	}
	return n
}
