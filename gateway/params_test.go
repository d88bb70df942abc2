package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// TestDecodeParamsRefusesHostileShapes: values PostgreSQL cannot store
// (NUL) and shapes that parsers disagree on (duplicate keys) or that cost
// a deep recursion are refused with -32602 naming the field, before any
// handler sees them.
func TestDecodeParamsRefusesHostileShapes(t *testing.T) {
	type params struct {
		Prompt string          `json:"prompt"`
		Count  *int64          `json:"count"`
		Ratio  float64         `json:"ratio"`
		Value  json.RawMessage `json:"value"`
		Sets   []struct {
			Value json.RawMessage `json:"value"`
		} `json:"sets"`
	}
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name, in, want string // want "" means accepted
	}{
		{"plain", `{"prompt":"hi","value":{"a":1,"b":[1,{"a":2}]}}`, ""},
		{"same key in sibling objects", `{"value":{"a":{"x":1},"b":{"x":1}},"sets":[{"value":1},{"value":1}]}`, ""},
		{"escaped backslash before u0000 is no NUL", `{"prompt":"\\u0000"}`, ""},
		{"duplicate top-level key", `{"prompt":"a","prompt":"b"}`, "`prompt` appears twice"},
		{"duplicate nested key", `{"value":{"a":1,"a":2}}`, "`value.a` appears twice"},
		{"duplicate escaped key", `{"value":{"a":1,"\u0061":2}}`, "`value.a` appears twice"},
		{"duplicate in array element", `{"sets":[{"value":1},{"value":1,"value":2}]}`, "`sets[1].value` appears twice"},
		// encoding/json matches a field to any key equal under Unicode
		// case folding, and the last such key would win.
		{"duplicate top-level key by case", `{"prompt":"a","PROMPT":"b"}`, "`PROMPT` appears twice"},
		{"duplicate top-level key by long s", "{\"sets\":[],\"\u017fets\":[]}", "`\u017fets` appears twice"},
		{"nested keys differing in case are a map's", `{"value":{"Path":1,"PATH":2}}`, ""},
		{"NUL in a string", `{"prompt":"a\u0000b"}`, "`prompt` must not contain NUL characters"},
		{"NUL deep in a value", `{"sets":[{},{},{"value":{"x":"\u0000"}}]}`, "`sets[2].value.x` must not contain NUL characters"},
		{"NUL in an array element", `{"value":["ok","\u0000"]}`, "`value[1]` must not contain NUL characters"},
		{"NUL in a nested key", `{"value":{"a\u0000":1}}`, "`value` must not contain NUL characters"},
		{"NUL in a top-level key", `{"a\u0000":1}`, "params must not contain NUL characters"},
		// The field's type is named as a client knows it: an integer is
		// not just any number.
		{"fraction for an integer", `{"count":1.5}`, "`count` must be an integer"},
		{"string for an integer", `{"count":"1"}`, "`count` must be an integer"},
		{"string for a number", `{"ratio":"1"}`, "`ratio` must be a number"},
		{"nesting at the limit", `{"value":` + nest(jsonrpc.MaxParamsDepth) + `}`, ""},
		{"nesting past the limit", `{"value":` + nest(jsonrpc.MaxParamsDepth+1) + `}`, "`value` nests deeper than 64 levels"},
		{"9000-deep array", `{"value":` + nest(9000) + `}`, "`value` nests deeper than 64 levels"},
	} {
		var p params
		err := decodeParams(json.RawMessage(tc.in), &p)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.name, err)
			}
			continue
		}
		var e *jsonrpc.Error
		if !errors.As(err, &e) || e.Code != jsonrpc.CodeInvalidParams || e.Message != "Invalid params: "+tc.want {
			t.Errorf("%s: got %v, want -32602 %q", tc.name, err, "Invalid params: "+tc.want)
		}
	}
}

// decodeSessionID reads {"session_id":"<token>"} directly and every other
// shape through the general decoder; both give the same answers.
func TestDecodeSessionID(t *testing.T) {
	for _, tc := range []struct {
		params, want string
		bad          bool
	}{
		{params: `{"session_id":"sess_0123abc"}`, want: "sess_0123abc"},
		{params: `{"sessionId":"sess_0123abc"}`, want: "sess_0123abc"},
		{params: `{ "session_id" : "sess_1" }`, want: "sess_1"},
		{params: `{"session_id":"a","x":"b"}`, want: "a"},
		{params: `{"session_id":"a\u0062"}`, want: "ab"},
		{params: `{"session_id":"*"}`, bad: true},
		{params: `{"session_id":"a.b"}`, bad: true},
		{params: `{"session_id":""}`, bad: true},
		{params: `{"session_id":"a","session_id":"b"}`, bad: true},
		{params: `{"session_id":"` + strings.Repeat("x", 129) + `"}`, bad: true},
		{params: `{}`, bad: true},
	} {
		got, err := decodeSessionID(json.RawMessage(tc.params))
		if tc.bad {
			if err == nil {
				t.Errorf("%s: accepted as %q", tc.params, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.params, got, err, tc.want)
		}
	}
}

// TestNestedStructsRefuseFoldedKeys: a prompt's blocks, a prompt's
// attachments and an elicitation's reply are decoded into structs, so
// two spellings of one field are refused (or, in a reply, decide
// nothing) instead of the last one silently winning.
func TestNestedStructsRefuseFoldedKeys(t *testing.T) {
	_, err := promptText(json.RawMessage(`[{"type":"text","text":"hi","TEXT":"rm -rf"}]`))
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != "Invalid params: `prompt[0].TEXT` appears twice" {
		t.Errorf("prompt blocks: %v", err)
	}
	if got, err := promptText(json.RawMessage(`[{"type":"text","text":"a"},{"text":"b"}]`)); err != nil || got != "a\nb" {
		t.Errorf("plain blocks: %q, %v", got, err)
	}
	g := &Gateway{}
	_, err = g.sessionPrompt(t.Context(), &connState{id: "c"}, json.RawMessage(
		`{"session_id":"s1","prompt":"hi","attachments":[{"ref_id":"a","marker":"m","Ref_ID":"b"}]}`))
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != "Invalid params: `attachments[0].Ref_ID` appears twice" {
		t.Errorf("attachments: %v", err)
	}
	for reply, want := range map[string]sessionv1.Decision{
		`{"action":"accept","content":{"choice":"allow_always"}}`:                        sessionv1.Decision_DECISION_ALLOW_ALWAYS,
		`{"action":"decline","ACTION":"accept","content":{"choice":"allow_always"}}`:     sessionv1.Decision_DECISION_REJECT,
		`{"action":"accept","content":{"choice":"reject","Choice":"allow_always"}}`:      sessionv1.Decision_DECISION_REJECT,
		`{"action":"accept","content":{"choice":"allow_once"},"Content":{"choice":"x"}}`: sessionv1.Decision_DECISION_REJECT,
	} {
		if got := elicitationDecision(json.RawMessage(reply)); got != want {
			t.Errorf("reply %s: %v, want %v", reply, got, want)
		}
	}
}
