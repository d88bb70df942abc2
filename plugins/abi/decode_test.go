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
