package abi

import "testing"

// What AppendJSON writes for strings that need no escape is read the
// short way: the way a tool call's result is read without encoding/json.
func TestAppendJSONReadTheShortWay(t *testing.T) {
	for _, r := range []ToolResult{
		{Success: true, Output: "hello"},
		{Success: true, Output: "é 日本 🙂"},
		{Output: "", Error: new("refused")},
	} {
		b := ToolEnvelope{Ok: &r}.AppendJSON(nil)
		e, ok := decodeEnvelopeShort(b)
		if !ok {
			t.Errorf("%s: not read the short way", b)
			continue
		}
		if e.Err != nil || e.Ok.Success != r.Success || e.Ok.Output != r.Output || str(e.Ok.Error) != str(r.Error) {
			t.Errorf("%s: read as %+v", b, e.Ok)
		}
	}
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}
