package abi

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// DecodeToolEnvelope reads tool_execute's result: what encoding/json's
// Unmarshal into a ToolEnvelope gives (FuzzDecodeToolEnvelope holds the
// two together), or its error.
//
// The host reads one envelope per tool call, from a fresh instance, on
// caches a pause between calls has left cold: there encoding/json's
// decoding of a struct (its field cache, reflection) cost 7 to 19 µs of
// a call whose host side is some 70 to 90 (docs/performance.md, "Fourteenth
// round"). The shape AppendJSON writes, with an output and an error that
// need no unescaping, is read here directly; anything else goes to
// encoding/json.
func DecodeToolEnvelope(b []byte) (ToolEnvelope, error) {
	if e, ok := decodeEnvelopeShort(b); ok {
		return e, nil
	}
	var e ToolEnvelope
	err := json.Unmarshal(b, &e)
	return e, err
}

// decodeEnvelopeShort reads {"ok":{"success":B,"output":S}} and
// {"ok":{"success":B,"output":S,"error":null|S}}, nothing around it,
// strings without escapes; ok is false for any other input.
func decodeEnvelopeShort(b []byte) (ToolEnvelope, bool) {
	var r ToolResult
	var ok bool
	if b, ok = cutPrefix(b, `{"ok":{"success":`); !ok {
		return ToolEnvelope{}, false
	}
	switch {
	case bytes.HasPrefix(b, []byte("true")):
		r.Success, b = true, b[4:]
	case bytes.HasPrefix(b, []byte("false")):
		b = b[5:]
	default:
		return ToolEnvelope{}, false
	}
	if b, ok = cutPrefix(b, `,"output":`); !ok {
		return ToolEnvelope{}, false
	}
	if r.Output, b, ok = plainString(b); !ok {
		return ToolEnvelope{}, false
	}
	if rest, found := cutPrefix(b, `,"error":`); found {
		if rest, found = cutPrefix(rest, "null"); !found {
			var msg string
			if msg, rest, ok = plainString(rest); !ok {
				return ToolEnvelope{}, false
			}
			r.Error = &msg
		}
		b = rest
	}
	if string(b) != "}}" {
		return ToolEnvelope{}, false
	}
	return ToolEnvelope{Ok: &r}, true
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// plainString reads a JSON string at the start of b that decodes to its
// own bytes: valid UTF-8, no escape, no control character. ok is false
// for any other.
func plainString(b []byte) (s string, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", b, false
	}
	end := 1
	for ; end < len(b) && b[end] != '"'; end++ {
		if b[end] == '\\' || b[end] < 0x20 {
			return "", b, false
		}
	}
	if end == len(b) || !utf8.Valid(b[1:end]) {
		return "", b, false
	}
	return string(b[1:end]), b[end+1:], true
}
