package session

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// oldParams is how update params were encoded before the streaming path
// stopped building maps: a map of every member and alias through
// encoding/json. The encoder must give the same bytes.
func oldParams(id, typ string, f fields) []byte {
	params := make(map[string]any, len(f)+3)
	for k, v := range f {
		params[k] = v
	}
	params["session_id"] = id
	params["sessionId"] = id
	params["type"] = typ
	for snake, camel := range camelAliases {
		if v, ok := params[snake]; ok {
			params[camel] = v
		}
	}
	b, err := json.Marshal(params)
	if err != nil {
		panic(err)
	}
	return b
}

// Update params are encoded byte for byte as encoding/json encoded the
// map they used to be: sorted keys, the camelCase aliases, HTML-safe and
// invalid UTF-8 escapes, raw JSON compacted, any value type.
func TestUpdateParamsAsEncodingJSON(t *testing.T) {
	texts := []string{
		"", "plain words ", "1764583093123456789 ", `quote " and \ backslash`, "<b>&amp;</b>",
		"tab\tnew\nline\r", "\x00\x1f\x7f", "é ü 漢字 🙂", "\u2028\u2029", "bad \xff\xfe utf-8",
		strings.Repeat("long text ", 1000),
	}
	for _, text := range texts {
		for _, typ := range []string{UpdateMessageChunk, UpdateThoughtChunk} {
			want := oldParams("s-1", typ, fields{"turn_id": "turn_1", "text": text})
			var buf [5]field
			got, err := appendUpdateParams(nil, "s-1", typ, append(buf[:0], strField("text", text), strField("turn_id", "turn_1")))
			if err != nil || string(got) != string(want) {
				t.Fatalf("chunk %q: got %s (%v), want %s", text, got, err, want)
			}
			var back map[string]any
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatalf("chunk %q: not JSON: %v", text, err)
			}
		}
	}
	others := []fields{
		{"turn_id": "t", "tool_call_id": "tc_1", "name": "fs_read", "raw_input": json.RawMessage(`{ "path" : "a<b" }`)},
		{"turn_id": "t", "tool_call_id": "tc_1", "name": "x", "raw_input": "not json {"},
		{"turn_id": "t", "tool_call_id": "tc_1", "name": "x", "raw_output": "out\n<tag>", "status": "completed"},
		{"turn_id": "t", "outcome": "completed", "content": "done", "stop_reason": "end_turn", "client_turn_generation": int64(7)},
		{"turn_id": "t", "outcome": "failed", "error": "boom", "n": 3, "ok": true, "none": nil, "f": 1.5},
		{"turn_id": "t", "options": []map[string]any{{"kind": "allow_once", "name": "Allow"}}, "expires_at": "2026-01-01T00:00:00Z"},
		{"session_id": "ignored", "type": "ignored", "toolCallId": "kept without its snake_case"},
		{"tool_call_id": "snake", "toolCallId": "overridden by the snake_case value"},
	}
	for _, f := range others {
		want := oldParams("s-2", UpdateToolCall, f)
		var buf [12]field
		got, err := appendUpdateParams(nil, "s-2", UpdateToolCall, appendMembers(buf[:0], f))
		if err != nil || string(got) != string(want) {
			t.Fatalf("%v: got %s (%v), want %s", f, got, err, want)
		}
	}
}

func BenchmarkUpdateParams(b *testing.B) {
	b.Run("map+encoding/json", func(b *testing.B) {
		for b.Loop() {
			_ = oldParams("s-0123456789abcdef", UpdateMessageChunk, fields{"turn_id": "turn_0123456789abcdef", "text": "1764583093123456789 "})
		}
	})
	b.Run("encoder", func(b *testing.B) {
		// Strings made at run time, as a chunk's are: constants would
		// hide what storing one in an interface costs.
		id, turn := "s-"+strconv.Itoa(12345678), "turn_"+strconv.Itoa(12345678)
		text := strconv.FormatInt(time.Now().UnixNano(), 10) + " "
		var out []byte
		b.ReportAllocs()
		for b.Loop() {
			var buf [5]field
			out, _ = appendUpdateParams(out[:0], id, UpdateMessageChunk,
				append(buf[:0], strField("text", text), strField("turn_id", turn)))
		}
	})
}
