package abi

import "testing"

// What AppendJSON writes is read the short way, escapes included: the way
// a tool call's result is read without encoding/json.
func TestAppendJSONReadTheShortWay(t *testing.T) {
	for _, r := range []ToolResult{
		{Success: true, Output: "hello"},
		{Success: true, Output: "é 日本 🙂"},
		{Output: "", Error: new("refused")},
		{Success: true, Output: `{"city":"Paris","temp":21}`},
		{Success: true, Output: "<b>a & b</b>\n\tline\r\x01\u2028"},
		{Output: "x", Error: new("\"quoted\"")},
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
