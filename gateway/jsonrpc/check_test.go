package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
)

func nested(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// TestCheckParams pins each refusal, its path, and what stays accepted.
func TestCheckParams(t *testing.T) {
	many := `{` // an object past the linear-search size, with a late duplicate
	for i := 0; i < 3*keyListMax; i++ {
		many += `"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i) + `,`
	}
	for _, tc := range []struct {
		name, in string
		problem  ParamsProblem // 0: accepted
		path     string
	}{
		{"empty object", `{}`, 0, ""},
		{"typical", `{"session_id":"s-1","prompt":[{"type":"text","text":"hi \"there\" \\u0000"}]}`, 0, ""},
		{"scalars", ` {"a":true,"b":null,"c":-1.5e3,"d":[],"e":{}} `, 0, ""},
		{"same keys apart", `{"a":{"x":1,"y":{"x":2}},"b":[{"x":1},{"x":1}],"x":0}`, 0, ""},
		{"many keys", many + `"z":1}`, 0, ""},
		{"duplicate top", `{"prompt":1,"prompt":2}`, ParamsDuplicateKey, "prompt"},
		{"duplicate nested", `{"value":{"a":1,"b":2,"a":3}}`, ParamsDuplicateKey, "value.a"},
		{"duplicate escaped", `{"value":{"\u0061":1,"a":2}}`, ParamsDuplicateKey, "value.a"},
		{"duplicate after a closed sibling", `{"value":{"a":{"b":1},"a":2}}`, ParamsDuplicateKey, "value.a"},
		{"duplicate in many", many + `"k40":1}`, ParamsDuplicateKey, "k40"},
		{"duplicate as bad UTF-8", "{\"v\":{\"\xff\":1,\"\xfe\":2}}", ParamsDuplicateKey, "v.\ufffd"},
		{"duplicate in array", `{"sets":[{"prop":"a"},{"prop":"b","value":1,"prop":"c"}]}`, ParamsDuplicateKey, "sets[1].prop"},
		{"NUL in value", `{"prompt":"a\u0000"}`, ParamsNUL, "prompt"},
		{"NUL deep", `{"sets":[0,1,{"value":{"x":"\u0000"}}]}`, ParamsNUL, "sets[2].value.x"},
		{"NUL in key", `{"value":{"ok":1,"a\u0000b":1}}`, ParamsNUL, "value"},
		{"NUL in top key", `{"\u0000":1}`, ParamsNUL, ""},
		{"NUL at top", `"\u0000"`, ParamsNUL, ""},
		{"NUL in nested arrays", `{"v":[[1],["\u0000"]]}`, ParamsNUL, "v[1][0]"},
		{"depth at the limit", `{"value":` + nested("[", "]", MaxParamsDepth, "") + `}`, 0, ""},
		{"objects at the limit", `{"value":` + nested(`{"a":`, "}", MaxParamsDepth-1, "{}") + `}`, 0, ""},
		{"depth past the limit", `{"value":` + nested("[", "]", MaxParamsDepth+1, "") + `}`, ParamsTooDeep, "value"},
		{"objects past the limit", `{"sets":[` + nested(`{"a":`, "}", MaxParamsDepth, "{}") + `]}`, ParamsTooDeep, "sets"},
		{"9000-deep array", `{"value":` + nested("[", "]", 9000, "") + `}`, ParamsTooDeep, "value"},
		{"NUL beyond the limit is not reached", `{"value":` + nested("[", "]", 9000, `"\u0000"`) + `}`, ParamsTooDeep, "value"},
		{"duplicate top by case", `{"session_id":1,"SESSION_ID":2}`, ParamsDuplicateKey, "SESSION_ID"},
		{"duplicate top by mixed case", `{"prop":1,"value":2,"Prop":3}`, ParamsDuplicateKey, "Prop"},
		{"duplicate top by long s", "{\"session_id\":1,\"\u017fession_id\":2}", ParamsDuplicateKey, "\u017fession_id"},
		{"duplicate top by Kelvin sign", "{\"kind\":1,\"\u212aind\":2}", ParamsDuplicateKey, "\u212aind"},
		{"duplicate top by escaped case", `{"prompt":1,"\u0050rompt":2}`, ParamsDuplicateKey, "Prompt"},
		{"duplicate by case in many", many + `"K40":1}`, ParamsDuplicateKey, "K40"},
		{"duplicate by long s in many", many + "\"\u017fession\":1,\"SESSION\":2}", ParamsDuplicateKey, "SESSION"},
		{"case kept apart in nested objects", `{"env":{"PATH":"a","Path":"b"},"value":[{"A":1,"a":2}]}`, 0, ""},
		{"long key cut short", `{"` + strings.Repeat("k", 500) + `":1,"` + strings.Repeat("k", 500) + `":2}`, ParamsDuplicateKey, strings.Repeat("k", maxPathKeyBytes) + "..."},
		// Not JSON: nothing to say, the decoder will.
		{"truncated", `{"a":[1,`, 0, ""},
		{"garbage", `{"a"::,}]`, 0, ""},
		{"unterminated string", `{"a":"\u00`, 0, ""},
	} {
		err := CheckParams([]byte(tc.in))
		if tc.problem == 0 {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.name, err)
			}
			continue
		}
		var pe *ParamsError
		if !errors.As(err, &pe) || pe.Problem != tc.problem || pe.Path != tc.path {
			t.Errorf("%s: got %#v, want problem %d at %q", tc.name, err, tc.problem, tc.path)
		}
	}
	for _, tc := range []struct {
		err  ParamsError
		want string
	}{
		{ParamsError{ParamsDuplicateKey, "value.a"}, "`value.a` appears twice"},
		{ParamsError{ParamsNUL, "prompt"}, "`prompt` must not contain NUL characters"},
		{ParamsError{ParamsNUL, ""}, "params must not contain NUL characters"},
		{ParamsError{ParamsTooDeep, "value"}, "`value` nests deeper than 64 levels"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestCheckParamsDeepIsFlat: refusing a deep value costs the same whatever
// its depth: the scan stops at the limit and keeps no per-level state
// beyond it (a recursive checker would allocate or recurse per level).
func TestCheckParamsDeepIsFlat(t *testing.T) {
	shallow := []byte(`{"value":` + nested("[", "]", 9000, "") + `}`)
	deep := []byte(`{"value":` + nested("[", "]", 1<<20, "") + `}`)
	// One scanner, as the pool would hand out (the pool itself drops
	// entries at random under the race detector).
	s := scanPool.New().(*paramScan)
	run := func(in []byte) func() {
		return func() {
			err := s.run(in)
			s.reset()
			if in[len(in)-2] == ']' && err == nil {
				t.Fatal("deep value accepted")
			}
		}
	}
	run(deep)() // let the stack reach its size
	a := testing.AllocsPerRun(20, run(shallow))
	b := testing.AllocsPerRun(20, run(deep))
	if a != b {
		t.Fatalf("allocations grow with depth: %v at 9000, %v at 1Mi", a, b)
	}
	typical := []byte(`{"session_id":"s-1","prompt":[{"type":"text","text":"hello"}],"meta":{"a":1,"b":[1,2,3]}}`)
	if n := testing.AllocsPerRun(20, run(typical)); n > 0 {
		t.Fatalf("%v allocations to accept a typical params value", n)
	}
}

// FuzzCheckParams compares CheckParams with a reference built on
// encoding/json's tokenizer, and checks that it never panics on any input.
func FuzzCheckParams(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"x","value":{"a":[1,{"b":null}]}}`,
		`{"a":1,"a":2}`,
		`{"a":{"\u0061":1,"a":2}}`,
		`{"sets":[{},{"value":{"x":"\u0000"}}]}`,
		`{"k\u0000":1}`,
		`{"v":` + nested("[", "]", 70, "") + `}`,
		`{"v":` + nested(`{"a":`, "}", 66, "1") + `}`,
		`[[["\u0000"]]]`,
		`"\\u0000"`,
		"{\"\xff\":1,\"\xfe\":2}",
		`{"a":"\ud800","b":"\udc00\u0000"}`,
		`{"session_id":1,"SESSION_ID":2,"v":{"a":1,"A":2}}`,
		"{\"s\":1,\"\u017f\":2,\"\u212a\":3,\"k\":4}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := CheckParams(data) // must not panic, whatever data is
		if !json.Valid(data) {
			return
		}
		want := refCheckParams(data)
		var pe *ParamsError
		errors.As(err, &pe)
		switch {
		case want == nil && err == nil:
		case want == nil || pe == nil || pe.Problem != want.Problem:
			t.Fatalf("CheckParams(%q) = %v, reference %v", data, err, want)
		case len(want.Path) < maxPathKeyBytes && pe.Path != want.Path:
			t.Fatalf("CheckParams(%q) path %q, reference %q", data, pe.Path, want.Path)
		}
	})
}

// refCheckParams is CheckParams the obvious way on json.Decoder tokens
// (which unescape strings and keys as handlers will see them).
func refCheckParams(data []byte) *ParamsError {
	type level struct {
		obj   bool
		keys  map[string]bool
		key   string
		index int
		first bool
	}
	var stack []*level
	path := func(n int) string {
		var b strings.Builder
		for _, l := range stack[:n] {
			if l.obj {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(l.key)
			} else {
				b.WriteString("[" + strconv.Itoa(l.index) + "]")
			}
		}
		return b.String()
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	expectKey := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return nil
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if expectKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				expectKey = len(stack) > 0 && stack[len(stack)-1].obj
				continue
			}
			k := tok.(string)
			if strings.IndexByte(k, 0) >= 0 {
				return &ParamsError{Problem: ParamsNUL, Path: path(len(stack) - 1)}
			}
			top.key = k
			if top.keys[k] {
				return &ParamsError{Problem: ParamsDuplicateKey, Path: path(len(stack))}
			}
			if len(stack) == 1 { // params itself: keys equal but for case are one
				for prev := range top.keys {
					if strings.EqualFold(prev, k) {
						return &ParamsError{Problem: ParamsDuplicateKey, Path: path(len(stack))}
					}
				}
			}
			top.keys[k] = true
			expectKey = false
			continue
		}
		// A value, or the end of an array.
		if top != nil && !top.obj {
			if d, ok := tok.(json.Delim); ok && d == ']' {
				stack = stack[:len(stack)-1]
				expectKey = len(stack) > 0 && stack[len(stack)-1].obj
				continue
			}
			if top.first {
				top.index++
			}
			top.first = true
		}
		switch v := tok.(type) {
		case json.Delim:
			if len(stack) > MaxParamsDepth {
				return &ParamsError{Problem: ParamsTooDeep, Path: path(min(len(stack), 1))}
			}
			l := &level{obj: v == '{', keys: map[string]bool{}}
			stack = append(stack, l)
			expectKey = l.obj
			continue
		case string:
			if strings.IndexByte(v, 0) >= 0 {
				return &ParamsError{Problem: ParamsNUL, Path: path(len(stack))}
			}
		}
		expectKey = top != nil && top.obj
	}
}

// BenchmarkCheckParams: the cost CheckParams adds to decoding a typical
// params value, against the decode itself (json.Unmarshal into a map) as
// the baseline in the same run.
func BenchmarkCheckParams(b *testing.B) {
	in := []byte(`{"session_id":"s-1","prompt":[{"type":"text","text":"please summarise the file and list its exported names"}],"meta":{"cwd":"/home/u/p","tui_id":"t-1"}}`)
	b.Run("unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			var v map[string]any
			_ = json.Unmarshal(in, &v)
		}
	})
	b.Run("check", func(b *testing.B) {
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if err := CheckParams(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestCheckStructsFoldsToItsDepth: a value decoded into structs down to a
// depth has its keys folded there, and only there (maps below keep keys
// that differ by case).
func TestCheckStructsFoldsToItsDepth(t *testing.T) {
	for _, tc := range []struct {
		in    string
		depth int
		path  string // "" means accepted
	}{
		{`[{"path":"/a"},{"path":"/b","PATH":"/c"}]`, 2, "[1].PATH"},
		{`[{"path":"/a"},{"path":"/b","PATH":"/c"}]`, 1, ""},
		{`[{"env":{"PATH":"a","Path":"b"}}]`, 2, ""},
		{`[{"env":{"PATH":"a","Path":"b"}}]`, 3, "[0].env.Path"},
		{`[{"env":{"PATH":"a","PATH":"b"}}]`, 2, "[0].env.PATH"},
		{`{"elicitation":true,"ſlicitation":1,"Elicitation":false}`, 1, "Elicitation"},
		{`{"action":"accept","content":{"choice":"reject","CHOICE":"allow_always"}}`, 2, "content.CHOICE"},
		{`{"action":"accept","content":{"choice":"reject","CHOICE":"allow_always"}}`, 1, ""},
	} {
		err := CheckStructs([]byte(tc.in), tc.depth)
		if tc.path == "" {
			if err != nil {
				t.Errorf("%s at depth %d: refused: %v", tc.in, tc.depth, err)
			}
			continue
		}
		var pe *ParamsError
		if !errors.As(err, &pe) || pe.Problem != ParamsDuplicateKey || pe.Path != tc.path {
			t.Errorf("%s at depth %d: got %v, want a duplicate at %q", tc.in, tc.depth, err, tc.path)
		}
	}
	// The pool's scanners are reused: a deep check leaves none folding
	// deeper for the next CheckParams.
	if err := CheckParams([]byte(`{"v":[{"a":1,"A":2}]}`)); err != nil {
		t.Fatalf("CheckParams after CheckStructs: %v", err)
	}
}
