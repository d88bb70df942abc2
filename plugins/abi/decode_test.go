package abi_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
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

// checkCutAsWhole fails when DecodeToolEnvelopeCut at limit and
// DecodeToolEnvelope, whose output, error and err are then cut by
// tooloutput.Start, disagree on b: one fails and not the other, or they
// read different envelopes or sizes.
func checkCutAsWhole(t *testing.T, b []byte, limit int) {
	t.Helper()
	want, wantErr := abi.DecodeToolEnvelope(b)
	wantTotal, wantErrTotal := 0, 0
	cut := func(s *string) (*string, int) {
		if wantErr != nil || limit <= 0 || s == nil || len(*s) <= limit {
			return s, 0
		}
		c := tooloutput.Start(*s, limit)
		return &c, len(*s)
	}
	if want.Ok != nil {
		var out *string
		out, wantTotal = cut(&want.Ok.Output)
		want.Ok.Output = *out
		want.Ok.Error, wantErrTotal = cut(want.Ok.Error)
	}
	var n int
	want.Err, n = cut(want.Err)
	wantErrTotal = max(wantErrTotal, n)
	got, total, errTotal, err := abi.DecodeToolEnvelopeCut(b, limit)
	if (err == nil) != (wantErr == nil) || (err == nil && (!reflect.DeepEqual(got, want) || total != wantTotal || errTotal != wantErrTotal)) {
		t.Fatalf("%q at %d: got %+v of %d, %d (%v), whole and cut %+v of %d, %d (%v)", b, limit, got, total, errTotal, err, want, wantTotal, wantErrTotal, wantErr)
	}
}

// Envelopes whose output has a character, an escape or a bad byte across
// the cut, or a fault (a malformed escape, a control character, no end)
// past it.
var cutEnvelopeCases = []string{
	`{"ok":{"success":true,"output":"aé日🙂b"}}`,
	`{"ok":{"success":true,"output":"a\u00e9\u65e5\ud83d\ude00b","error":null}}`,
	`{"ok":{"success":false,"output":"ab\n\"\\c","error":"why \u00e9"}}`,
	"{\"ok\":{\"success\":true,\"output\":\"a\xffb\xc3\xa9\xc3\"}}",
	"{\"ok\":{\"success\":true,\"output\":\"abc\",\"error\":\"bad \xff\"}}",
	`{"ok":{"success":true,"output":"ab\ud83dxyz"}}`,
	`{"ok":{"success":true,"output":"abcdefgh\u00"}}`,
	`{"ok":{"success":true,"output":"abcdefgh\q"}}`,
	"{\"ok\":{\"success\":true,\"output\":\"abcdefgh\x01\"}}",
	`{"ok":{"success":true,"output":"abcdefgh`,
	`{"ok":{"success":true,"output":"abcdefgh"`,
	`{"ok":{"success":true,"output":"abcdefgh"}`,
	`{"ok":{"success":true,"output":"abcdefgh","error":"x}}`,
	`{"ok":{"success":true,"output":"abcdefgh","error":nul}}`,
	`{"ok":{"output":"abcdefgh","success":true}}`,
	`{"ok":{"success":true,"output":"abcdefgh"},"err":"both"}`,
	`{"ok":{"success":true,"output":"abcdefgh","output":"ijklmnopq"}}`,
	` {"ok":{"success":true,"output":"abc\u00e9defgh"}}`,
	`{"err":"a\u00e9\u65e5\ud83d\ude00bcdefgh"}`,
	"{\"err\":\"aé日🙂b\xff\xc3cdefgh\"}",
	`{"err":"abcdefgh\u00"}`,
	`{"err":"abcdefgh"} `,
	`{"err":"abcdefgh"`,
	`{"err":"abcdefgh","err":"ijklmnopq"}`,
	`{"ok":{"success":false,"output":"abcdefgh","error":"ijkl\u00e9mnop\n"}}`,
	`{"ok":{"success":false,"output":"","error":"abcdefgh\q"}}`,
	`{"ok":{"success":false,"output":"abcdefghij","error":"abcdefghijklm"},"err":"abcdefghijklmnopq"}`,
}

func TestDecodeToolEnvelopeCutAsWhole(t *testing.T) {
	for _, c := range append(append([]string(nil), envelopeCases...), cutEnvelopeCases...) {
		for limit := -1; limit <= 14; limit++ {
			checkCutAsWhole(t, []byte(c), limit)
		}
	}
	// An output cut inside a character ends before it; its size is the
	// whole's, decoded.
	e, total, _, err := abi.DecodeToolEnvelopeCut([]byte(`{"ok":{"success":true,"output":"ab\u00e9\ud83d\ude00"}}`), 3)
	if err != nil || e.Ok.Output != "ab" || total != 8 {
		t.Fatalf("read %+v of %d, %v; want \"ab\" of 8", e.Ok, total, err)
	}
	// A fault past the cut fails the whole envelope.
	if _, _, _, err := abi.DecodeToolEnvelopeCut([]byte(`{"ok":{"success":true,"output":"`+strings.Repeat("a", 100)+`\u12"}}`), 10); err == nil {
		t.Fatal("a malformed escape past the cut was read")
	}
}

func FuzzDecodeToolEnvelopeCut(f *testing.F) {
	for _, c := range append(append([]string(nil), envelopeCases...), cutEnvelopeCases...) {
		f.Add([]byte(c), uint8(4))
	}
	f.Fuzz(func(t *testing.T, b []byte, limit uint8) { checkCutAsWhole(t, b, int(limit)) })
}

// resultOf16MiB is the envelope of period repeated to just under the 16
// MiB a guest's result may be.
func resultOf16MiB(tb testing.TB, period string) []byte {
	tb.Helper()
	one := len(abi.ToolEnvelope{Ok: &abi.ToolResult{Output: period}}.AppendJSON(nil)) - len(`{"ok":{"success":false,"output":"","error":null}}`)
	out := strings.Repeat(period, (16<<20-64)/one)
	return abi.ToolEnvelope{Ok: &abi.ToolResult{Success: true, Output: out}}.AppendJSON(nil)
}

// A 16 MiB result read for a caller that keeps 1 MiB allocates about the
// MiB kept: the output was unquoted whole (16 MiB, and as much again for
// the copy the host took of it) before it was cut.
func TestDecodeToolEnvelopeCutAllocatesWhatIsKept(t *testing.T) {
	const limit = 1 << 20
	for _, period := range []string{"plain text ", "a \"quoted\" line\n", "é日🙂"} {
		env := resultOf16MiB(t, period)
		var e abi.ToolEnvelope
		var total int
		var err error
		perCall := testenv.AllocatedBytes(func() { e, total, _, err = abi.DecodeToolEnvelopeCut(env, limit) })
		if err != nil || len(e.Ok.Output) > limit || len(e.Ok.Output) < limit-3 || total <= limit {
			t.Fatalf("%q: kept %d bytes of %d, %v", period, len(e.Ok.Output), total, err)
		}
		t.Logf("%q: a %d-byte result, %d bytes of output kept: %d bytes allocated", period, len(env), len(e.Ok.Output), perCall)
		if perCall > 2*limit {
			t.Errorf("%q: reading a %d-byte result to keep %d bytes allocated %d bytes", period, len(env), limit, perCall)
		}
	}
}

// BenchmarkDecodeToolEnvelopeCut reads a 16 MiB result keeping the 1 MiB
// a session keeps (B/op is what the read allocates), against reading it
// whole and then cutting it.
func BenchmarkDecodeToolEnvelopeCut(b *testing.B) {
	env := resultOf16MiB(b, "a \"quoted\" line\n")
	b.Run("cut-as-read", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(env)))
		for b.Loop() {
			if _, total, _, err := abi.DecodeToolEnvelopeCut(env, 1<<20); err != nil || total == 0 {
				b.Fatal(err)
			}
		}
	})
	b.Run("whole-then-cut", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(env)))
		for b.Loop() {
			e, err := abi.DecodeToolEnvelope(append([]byte(nil), env...))
			if err != nil || len(tooloutput.Start(e.Ok.Output, 1<<20)) == 0 {
				b.Fatal(err)
			}
		}
	})
}
