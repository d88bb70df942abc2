package abi_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// checkDecodeAsEncodingJSON fails when DecodeToolEnvelope and
// encoding/json disagree on b: one fails and not the other, or they read
// different envelopes.
func checkDecodeAsEncodingJSON(t *testing.T, b []byte) {
	t.Helper()
	var want abi.ToolEnvelope
	wantErr := json.Unmarshal(b, &want)
	got, err := abi.DecodeToolEnvelope(b)
	if (err == nil) != (wantErr == nil) || (err == nil && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%q: got %+v (%v), encoding/json %+v (%v)", b, got, err, want, wantErr)
	}
}

var envelopeCases = []string{
	`{"ok":{"success":true,"output":"ok"}}`,
	`{"ok":{"success":false,"output":"","error":null}}`,
	`{"ok":{"success":false,"output":"x","error":"boom"}}`,
	`{"ok":{"success":true,"output":"é 日本 🙂"}}`,
	`{"ok":{"success":true,"output":"a\nb"}}`,
	`{"ok":{"success":true,"output":"a\u0041"}}`,
	`{"ok":{"success":true,"output":"{\"a\":\"\u003cb\u003e\"}\n\ud83d\ude00 \ud800 \ufffd"}}`,
	`{"ok":{"success":true,"output":"a\u00"}}`,
	`{"ok":{"success":false,"output":"x","error":"\"boom\"\t"}}`,
	"{\"ok\":{\"success\":true,\"output\":\"bad \xff\"}}",
	"{\"ok\":{\"success\":true,\"output\":\"tab\t\"}}",
	`{"ok":{"success":true,"output":"ok"}} `,
	`{"ok":{"success":true,"output":"ok"}}}`,
	`{"ok":{"success":true,"output":"ok"},"err":"both"}`,
	`{"err":"refused"}`,
	`{"ok":{"success":true,"output":"ok","error":nul}}`,
	`{"ok":{"success":tru,"output":"ok"}}`,
	`{"ok":{"success":true,"output":"ok"`,
	`{"ok":{"success":true,"output":"ok}}`,
	`{"ok":{"success":true,"output":1}}`,
	`{"OK":{"Success":true,"Output":"case"}}`,
	`{"ok":{"success":true,"output":"ok","output":"last"}}`,
	`{"ok":null}`,
	``,
	`null`,
}

func TestDecodeToolEnvelopeAsEncodingJSON(t *testing.T) {
	for _, c := range envelopeCases {
		checkDecodeAsEncodingJSON(t, []byte(c))
	}
	// What a Go guest writes is read right (and the short way:
	// TestAppendJSONReadTheShortWay).
	for _, r := range []abi.ToolResult{{Success: true, Output: "hello"}, {Output: "no", Error: new("refused")}} {
		b := abi.ToolEnvelope{Ok: &r}.AppendJSON(nil)
		checkDecodeAsEncodingJSON(t, b)
	}
}

func FuzzDecodeToolEnvelope(f *testing.F) {
	for _, c := range envelopeCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeAsEncodingJSON(t, b)
	})
}

// checkRecallAsEncodingJSON fails when DecodeRecallAnswer reads b and
// encoding/json does not read it as one "ok" of the same entries.
func checkRecallAsEncodingJSON(t *testing.T, b []byte) {
	t.Helper()
	got, ok := abi.DecodeRecallAnswer(b)
	if !ok {
		return
	}
	var env map[string]json.RawMessage
	var want []abi.MemoryEntry
	if err := json.Unmarshal(b, &env); err != nil || len(env) != 1 || env["ok"] == nil {
		t.Fatalf("%q read as %+v; encoding/json's envelope %v (%v)", b, got, env, err)
	}
	if err := json.Unmarshal(env["ok"], &want); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%q read as %+v; encoding/json %+v (%v)", b, got, want, err)
	}
}

var recallCases = []string{
	`{"ok":[]}`,
	`{"ok":[{"key":"k","content":"c"}]}`,
	`{"ok":[{"key":"k","content":"a\nb\u0001\"\\ é","category":"x","session_id":"s-1","timestamp":-12,"score":0.25}]}`,
	`{"ok":[{"key":"a","content":""},{"key":"b","content":"","score":1e3},{"key":"c","content":"","score":-0}]}`,
	`{"ok":[{"key":"k","content":"c","timestamp":1.5}]}`,
	`{"ok":[{"key":"k","content":"c","timestamp":01}]}`,
	`{"ok":[{"key":"k","content":"c","timestamp":99999999999999999999}]}`,
	`{"ok":[{"key":"k","content":"c","score":1e999}]}`,
	`{"ok":[{"key":"k","content":"c","score":.5}]}`,
	`{"ok":[{"key":"k","content":"c","score":1.}]}`,
	`{"ok":[{"key":"k","content":"c","score":1e}]}`,
	`{"ok":[{"key":"k","content":"c","score":-}]}`,
	`{"ok":[{"key":"k","content":"c"},]}`,
	`{"ok":[{"key":"k","content":"c"}]} `,
	`{"ok":[{"key":"k","content":"c"}]}}`,
	`{"ok":[{"content":"c","key":"k"}]}`,
	`{"ok":[{"key":"k","content":"c","key":"k2"}]}`,
	`{"ok":[{"KEY":"k","content":"c"}]}`,
	`{"ok":null}`,
	`{"err":"no"}`,
	"{\"ok\":[{\"key\":\"k\",\"content\":\"\xff\"}]}",
	`{"ok":[{"key":"k","content":"\ud800"}]}`,
	`{"ok":[{"key":"k","content":"c","timestamp":-0,"score":0E+2}]}`,
	``,
}

func TestDecodeRecallAnswerAsEncodingJSON(t *testing.T) {
	for _, c := range recallCases {
		checkRecallAsEncodingJSON(t, []byte(c))
	}
	// What the guest library writes is read the short way.
	for _, c := range recallCases[:4] {
		if _, ok := abi.DecodeRecallAnswer([]byte(c)); !ok {
			t.Fatalf("%s not read", c)
		}
	}
}

func FuzzDecodeRecallAnswer(f *testing.F) {
	for _, c := range recallCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkRecallAsEncodingJSON)
}

// BenchmarkDecodeToolEnvelope reads a tool's result whose output is a
// small JSON document, every quote of it escaped.
func BenchmarkDecodeToolEnvelope(b *testing.B) {
	out := `{"city":"Paris","temp":21.5,"conditions":["cloudy","wind"],"source":"<https://example.org/weather?q=paris&units=metric>"}`
	env := abi.ToolEnvelope{Ok: &abi.ToolResult{Success: true, Output: out}}.AppendJSON(nil)
	b.SetBytes(int64(len(env)))
	for b.Loop() {
		if e, err := abi.DecodeToolEnvelope(env); err != nil || e.Ok.Output != out {
			b.Fatal(e, err)
		}
	}
}
