package abi

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
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
// strings jsonstr.Unquote reads; ok is false for any other input.
func decodeEnvelopeShort(b []byte) (ToolEnvelope, bool) {
	var r ToolResult
	var ok bool
	if r.Success, b, ok = cutSuccess(b); !ok {
		return ToolEnvelope{}, false
	}
	if r.Output, b, ok = jsonstr.Unquote(b); !ok {
		return ToolEnvelope{}, false
	}
	if rest, found := cutPrefix(b, `,"error":`); found {
		if rest, found = cutPrefix(rest, "null"); !found {
			var msg string
			if msg, rest, ok = jsonstr.Unquote(rest); !ok {
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

// DecodeToolEnvelopeCut is DecodeToolEnvelope whose ok output, when it
// is longer than limit bytes (limit above zero), is cut to its start of at
// most limit bytes at a character boundary, as tooloutput.Start cuts it;
// total is then the whole output's size, else zero. FuzzDecodeToolEnvelopeCut
// holds it to DecodeToolEnvelope.
//
// A tool's result may be 16 MiB, and the sandbox's caller keeps 1 MiB of
// its output: the envelope AppendJSON writes is read here with the output
// kept only as far as the cut needs (one byte past it, where the cut looks
// for a character's start) and the rest measured, never written. Any other
// shape is decoded whole and then cut.
func DecodeToolEnvelopeCut(b []byte, limit int) (e ToolEnvelope, total int, err error) {
	if limit > 0 {
		var ok bool
		if e, total, ok = decodeEnvelopeShortCut(b, limit); ok {
			return e, total, nil
		}
	}
	if e, err = DecodeToolEnvelope(b); err != nil || limit <= 0 || e.Ok == nil || len(e.Ok.Output) <= limit {
		return e, 0, err
	}
	total = len(e.Ok.Output)
	e.Ok.Output = cutAtCharacter(e.Ok.Output, limit)
	return e, total, nil
}

// decodeEnvelopeShortCut is decodeEnvelopeShort reading the output with
// jsonstr.UnquoteStart.
func decodeEnvelopeShortCut(b []byte, limit int) (e ToolEnvelope, total int, ok bool) {
	var r ToolResult
	if r.Success, b, ok = cutSuccess(b); !ok {
		return ToolEnvelope{}, 0, false
	}
	if r.Output, total, b, ok = jsonstr.UnquoteStart(b, min(limit, math.MaxInt-1)+1); !ok {
		return ToolEnvelope{}, 0, false
	}
	if rest, found := cutPrefix(b, `,"error":`); found {
		if rest, found = cutPrefix(rest, "null"); !found {
			// Kept whole, as the error is; read so that a bad byte in it
			// does not send the whole output to encoding/json.
			var msg string
			if msg, _, rest, ok = jsonstr.UnquoteStart(rest, math.MaxInt); !ok {
				return ToolEnvelope{}, 0, false
			}
			r.Error = &msg
		}
		b = rest
	}
	if string(b) != "}}" {
		return ToolEnvelope{}, 0, false
	}
	if total <= limit {
		return ToolEnvelope{Ok: &r}, 0, true
	}
	r.Output = cutAtCharacter(r.Output, limit)
	return ToolEnvelope{Ok: &r}, total, true
}

// cutAtCharacter is s's start of at most n bytes, backed up to a
// character's start: tooloutput.Start, which this package (linked into
// every Go plugin) does not import. It looks at s[n] alone past the cut,
// so a start of n+1 bytes is cut as the whole would be.
func cutAtCharacter(s string, n int) string {
	cut := min(n, len(s))
	for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// cutSuccess reads an envelope's start, {"ok":{"success":B,"output":,
// and returns B and what follows.
func cutSuccess(b []byte) (success bool, rest []byte, ok bool) {
	if b, ok = cutPrefix(b, `{"ok":{"success":`); !ok {
		return false, b, false
	}
	switch {
	case bytes.HasPrefix(b, []byte("true")):
		success, b = true, b[4:]
	case bytes.HasPrefix(b, []byte("false")):
		b = b[5:]
	default:
		return false, b, false
	}
	b, ok = cutPrefix(b, `,"output":`)
	return success, b, ok
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// DecodeRecallAnswer reads memory_recall's answer as the guest library
// writes it: {"ok":[E,…]} and nothing around it, each E {"key":S,
// "content":S} followed, in this order and each at most once, by
// "category":S, "session_id":S, "timestamp":I and "score":N (numbers by
// JSON's grammar, jsonstr.NumberEnd, parsed as encoding/json parses them). It gives
// what encoding/json gives for the entries (FuzzDecodeRecallAnswer holds
// the two together); ok is false for any other answer, which the caller
// leaves to encoding/json.
//
// encoding/json read a 1 MiB answer of plain text in about 5 ms, its
// strings at some 200 MB/s; jsonstr.Unquote reads them about six times
// as fast.
func DecodeRecallAnswer(b []byte) (entries []MemoryEntry, ok bool) {
	if b, ok = cutPrefix(b, `{"ok":[`); !ok {
		return nil, false
	}
	entries = []MemoryEntry{} // as encoding/json decodes []
	for {
		if rest, end := cutPrefix(b, "]}"); end {
			return entries, len(rest) == 0
		}
		if len(entries) > 0 {
			if b, ok = cutPrefix(b, ","); !ok {
				return nil, false
			}
		}
		var e MemoryEntry
		if b, ok = cutPrefix(b, `{"key":`); !ok {
			return nil, false
		}
		if e.Key, b, ok = jsonstr.Unquote(b); !ok {
			return nil, false
		}
		if b, ok = cutPrefix(b, `,"content":`); !ok {
			return nil, false
		}
		if e.Content, b, ok = jsonstr.Unquote(b); !ok {
			return nil, false
		}
		for _, f := range []struct {
			name string
			to   *string
		}{{`,"category":`, &e.Category}, {`,"session_id":`, &e.SessionID}} {
			if rest, found := cutPrefix(b, f.name); found {
				if *f.to, b, ok = jsonstr.Unquote(rest); !ok {
					return nil, false
				}
			}
		}
		if rest, found := cutPrefix(b, `,"timestamp":`); found {
			n := jsonstr.NumberEnd(rest, 0)
			if n < 0 {
				return nil, false
			}
			t, err := strconv.ParseInt(string(rest[:n]), 10, 64)
			if err != nil {
				return nil, false
			}
			e.Timestamp, b = t, rest[n:]
		}
		if rest, found := cutPrefix(b, `,"score":`); found {
			n := jsonstr.NumberEnd(rest, 0)
			if n < 0 {
				return nil, false
			}
			f, err := strconv.ParseFloat(string(rest[:n]), 64)
			if err != nil {
				return nil, false
			}
			e.Score, b = &f, rest[n:]
		}
		if b, ok = cutPrefix(b, "}"); !ok {
			return nil, false
		}
		entries = append(entries, e)
	}
}
