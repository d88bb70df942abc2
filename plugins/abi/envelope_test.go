package abi_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// envelopes are every shape of ToolEnvelope the guest returns (and the two
// it never does), each with text that needs every kind of escape.
func envelopes(output, msg string) []abi.ToolEnvelope {
	return []abi.ToolEnvelope{
		{Ok: &abi.ToolResult{Success: true, Output: output}},
		{Ok: &abi.ToolResult{Success: false, Output: output, Error: &msg}},
		{Err: &msg},
		{Ok: &abi.ToolResult{Output: output}, Err: &msg},
		{},
	}
}

func checkSameAsEncodingJSON(t *testing.T, output, msg string) {
	t.Helper()
	for _, e := range envelopes(output, msg) {
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.AppendJSON(nil); !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON(%+v)\n got %s\nwant %s", e, got, want)
		}
	}
}

// The strings' escapes one by one are internal/jsonstr's test; here every
// shape of envelope carries no text, plain text, and one text holding
// every kind of escape at once.
func TestToolEnvelopeJSON(t *testing.T) {
	every := "quote \" backslash \\ \b\f\n\r\t\x00\x1f\x7f <a>&amp; é 日本 🙂 \u2028\u2029 bad \xff cut \xe6\x97 end"
	for _, s := range []string{"", "hello", every} {
		checkSameAsEncodingJSON(t, s, s+"!")
	}
	// Appends to what dst holds.
	e := abi.ToolEnvelope{Err: new("x")}
	if got := string(e.AppendJSON([]byte("pre:"))); got != `pre:{"err":"x"}` {
		t.Fatalf("got %s", got)
	}
}

func FuzzToolEnvelopeJSON(f *testing.F) {
	f.Add("hello", "refused")
	f.Add("<\x00\xff\u2028>", `"\`)
	f.Fuzz(func(t *testing.T, output, msg string) {
		checkSameAsEncodingJSON(t, output, msg)
	})
}
