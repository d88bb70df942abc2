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

// DecodeToolEnvelopeCut is DecodeToolEnvelope whose ok output, ok error
// and err message, each when it is longer than limit bytes (limit above
// zero), is cut to its start of at most limit bytes at a character
// boundary, as tooloutput.Start cuts it; outputBytes is then the whole
// output's size and errorBytes the whole error's (the longer of ok's
// error and err, when an envelope holds both), else zero.
// FuzzDecodeToolEnvelopeCut holds it to DecodeToolEnvelope.
//
// A tool's result may be 16 MiB, and the sandbox's caller keeps 1 MiB of
// its output, or of its error: the envelopes AppendJSON writes are read
// here with each string kept only as far as the cut needs (one byte past
// it, where the cut looks for a character's start) and the rest measured,
// never written. Any other shape is decoded whole and then cut.
func DecodeToolEnvelopeCut(b []byte, limit int) (e ToolEnvelope, outputBytes, errorBytes int, err error) {
	if limit > 0 {
		var ok bool
		if e, outputBytes, errorBytes, ok = decodeEnvelopeShortCut(b, limit); ok {
			return e, outputBytes, errorBytes, nil
		}
	}
	if e, err = DecodeToolEnvelope(b); err != nil || limit <= 0 {
		return e, 0, 0, err
	}
	if e.Ok != nil {
		e.Ok.Output, outputBytes = cutWhole(e.Ok.Output, limit)
		if e.Ok.Error != nil {
			msg, n := cutWhole(*e.Ok.Error, limit)
			e.Ok.Error, errorBytes = &msg, n
		}
	}
	if e.Err != nil {
		msg, n := cutWhole(*e.Err, limit)
		e.Err, errorBytes = &msg, max(errorBytes, n)
	}
	return e, outputBytes, errorBytes, nil
}

// decodeEnvelopeShortCut reads the envelopes AppendJSON writes, {"err":S}
// and decodeEnvelopeShort's, with each string read by
// jsonstr.UnquoteStart.
func decodeEnvelopeShortCut(b []byte, limit int) (e ToolEnvelope, outputBytes, errorBytes int, ok bool) {
	keep := min(limit, math.MaxInt-1) + 1
	if rest, found := cutPrefix(b, `{"err":`); found {
		var msg string
		var total int
		if msg, total, rest, ok = jsonstr.UnquoteStart(rest, keep); !ok || string(rest) != "}" {
			return ToolEnvelope{}, 0, 0, false
		}
		msg, errorBytes = cutKept(msg, total, limit)
		return ToolEnvelope{Err: &msg}, 0, errorBytes, true
	}
	var r ToolResult
	if r.Success, b, ok = cutSuccess(b); !ok {
		return ToolEnvelope{}, 0, 0, false
	}
	var total int
	if r.Output, total, b, ok = jsonstr.UnquoteStart(b, keep); !ok {
		return ToolEnvelope{}, 0, 0, false
	}
	r.Output, outputBytes = cutKept(r.Output, total, limit)
	if rest, found := cutPrefix(b, `,"error":`); found {
		if rest, found = cutPrefix(rest, "null"); !found {
			var msg string
			if msg, total, rest, ok = jsonstr.UnquoteStart(rest, keep); !ok {
				return ToolEnvelope{}, 0, 0, false
			}
			msg, errorBytes = cutKept(msg, total, limit)
			r.Error = &msg
		}
		b = rest
	}
	if string(b) != "}}" {
		return ToolEnvelope{}, 0, 0, false
	}
	return ToolEnvelope{Ok: &r}, outputBytes, errorBytes, true
}

// cutKept is the start UnquoteStart kept of a string of total bytes, cut
// to limit as the whole would be, and the whole's size when it was cut,
// else zero.
func cutKept(start string, total, limit int) (string, int) {
	if total <= limit {
		return start, 0
	}
	return cutAtCharacter(start, limit), total
}

// cutWhole is cutKept of a whole string.
func cutWhole(s string, limit int) (string, int) { return cutKept(s, len(s), limit) }

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

// RecallCutEntry is an entry of a recall's answer as DecodeRecallAnswerCut
// reads it: the start of its key, content and category that an answer
// shown to room bytes may write, and the length of what jsonstr.Append
// writes for each whole (2 for an empty string).
type RecallCutEntry struct {
	Key, Content, Category             string
	KeyJSON, ContentJSON, CategoryJSON int
}

// DecodeRecallAnswerCut reads the answer DecodeRecallAnswer reads (ok is
// false for any other, left to the caller), keeping the first limit
// entries and of their key, content and category strings only what an
// answer written again from them, for a reader shown room bytes, may
// write: room+utf8.UTFMax bytes of them in all, in order. The rest is
// measured (jsonstr.LenUnquoted), never written; the entries past limit
// are only checked. recallanswer.BuildCut writes the answer from them;
// FuzzBuildCut holds the two to recallanswer.Build of encoding/json's
// entries.
//
// A recall's answer may be 16 MiB and its caller shows 1 MiB: decoded
// whole into entries, a copy of the answer and its strings took some 32
// MB of the sandbox's heap a recall.
func DecodeRecallAnswerCut(b []byte, limit, room int) (entries []RecallCutEntry, ok bool) {
	if b, ok = cutPrefix(b, `{"ok":[`); !ok {
		return nil, false
	}
	// Each byte kept is written at least once, so a string past room
	// bytes of those before it is never written; one that reaches the
	// room is cut there, at a character, which may need the bytes of the
	// character across it.
	keep := room + utf8.UTFMax
	entries = []RecallCutEntry{}
	for i := 0; ; i++ {
		if rest, end := cutPrefix(b, "]}"); end {
			return entries, len(rest) == 0
		}
		if i > 0 {
			if b, ok = cutPrefix(b, ","); !ok {
				return nil, false
			}
		}
		kept := i < limit
		if !kept {
			keep = 0
		}
		e := RecallCutEntry{CategoryJSON: 2}
		if b, ok = cutPrefix(b, `{"key":`); !ok {
			return nil, false
		}
		if e.Key, e.KeyJSON, b, ok = cutLiteral(b, &keep, kept); !ok {
			return nil, false
		}
		if b, ok = cutPrefix(b, `,"content":`); !ok {
			return nil, false
		}
		if e.Content, e.ContentJSON, b, ok = cutLiteral(b, &keep, kept); !ok {
			return nil, false
		}
		if rest, found := cutPrefix(b, `,"category":`); found {
			if e.Category, e.CategoryJSON, b, ok = cutLiteral(rest, &keep, kept); !ok {
				return nil, false
			}
		}
		if rest, found := cutPrefix(b, `,"session_id":`); found {
			// Not in the answer: checked only.
			if _, _, b, ok = jsonstr.UnquoteStart(rest, 0); !ok {
				return nil, false
			}
		}
		if rest, found := cutPrefix(b, `,"timestamp":`); found {
			n := jsonstr.NumberEnd(rest, 0)
			if n < 0 {
				return nil, false
			}
			if _, err := strconv.ParseInt(string(rest[:n]), 10, 64); err != nil {
				return nil, false
			}
			b = rest[n:]
		}
		if rest, found := cutPrefix(b, `,"score":`); found {
			n := jsonstr.NumberEnd(rest, 0)
			if n < 0 {
				return nil, false
			}
			if _, err := strconv.ParseFloat(string(rest[:n]), 64); err != nil {
				return nil, false
			}
			b = rest[n:]
		}
		if b, ok = cutPrefix(b, "}"); !ok {
			return nil, false
		}
		if kept {
			entries = append(entries, e)
		}
	}
}

// cutLiteral reads the string literal at the start of b keeping *keep
// bytes of it, less what it kept, and its length as jsonstr.Append writes
// it when measure is set.
func cutLiteral(b []byte, keep *int, measure bool) (start string, jsonLen int, rest []byte, ok bool) {
	if start, _, rest, ok = jsonstr.UnquoteStart(b, *keep); !ok {
		return "", 0, b, false
	}
	*keep -= len(start)
	if measure {
		jsonLen = jsonstr.LenUnquoted(b)
	}
	return start, jsonLen, rest, true
}
