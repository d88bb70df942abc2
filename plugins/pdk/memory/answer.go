package memory

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/valyala/fastjson"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// decodeEntry decodes memory_store's argument. encoding/json spends about
// 290 units of the plugin's fuel a byte of content (0.3 of a call's 10^9
// on an entry of 1 MiB); fastjson finds a string's end with the runtime's
// IndexByte, and unquote decodes its escapes.
func decodeEntry(b []byte) (abi.MemoryEntry, error) {
	var p fastjson.Parser
	v, err := p.ParseBytes(b)
	if err != nil {
		return abi.MemoryEntry{}, err
	}
	o, err := v.Object()
	if err != nil {
		return abi.MemoryEntry{}, err
	}
	var e abi.MemoryEntry
	for _, f := range []struct {
		name string
		to   *string
	}{{"key", &e.Key}, {"content", &e.Content}, {"category", &e.Category}, {"session_id", &e.SessionID}} {
		fv := o.Get(f.name)
		if fv == nil {
			continue
		}
		// A string the parser has not touched marshals as it was written,
		// escapes and all (asking its type would unescape it). Each field
		// its own copy: the string decoded is made over it.
		raw := fv.MarshalTo(nil)
		if string(raw) == "null" {
			continue
		}
		if *f.to, err = unquote(raw); err != nil {
			return abi.MemoryEntry{}, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	if tv := o.Get("timestamp"); tv != nil && tv.Type() != fastjson.TypeNull {
		if e.Timestamp, err = tv.Int64(); err != nil {
			return abi.MemoryEntry{}, fmt.Errorf("timestamp: %w", err)
		}
	}
	return e, nil
}

// recallAnswer encodes memory_recall's {"ok":[entry…]} with the entries,
// best first, that keep it within abi.RecallAnswerBytes; the first is
// always kept. Entries past the budget are not encoded at all: encoding is
// most of what a large recall costs in fuel.
func recallAnswer(entries []abi.MemoryEntry) ([]byte, error) {
	out := append(make([]byte, 0, 512), `{"ok":[`...)
	for i, e := range entries {
		// An entry encodes to at least its strings' bytes: one that cannot
		// fit is not encoded.
		if i > 0 && len(out)+len(e.Key)+len(e.Content)+len(e.Category)+len(e.SessionID) > abi.RecallAnswerBytes {
			break
		}
		start := len(out)
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if out, err = appendEntry(out, e); err != nil {
			return nil, fmt.Errorf("marshal entry %d: %w", i, err)
		}
		if i > 0 && len(out)+len("]}") > abi.RecallAnswerBytes {
			out = out[:start]
			break
		}
	}
	return append(out, "]}"...), nil
}

// appendEntry appends e as a JSON object of abi.MemoryEntry's fields,
// omitting those encoding/json would omit, its strings with the escapes
// JSON requires alone (jsonstr.AppendMinimal). An answer of 1 MiB in kv,
// fuel a byte, encoding/json → AppendMinimal: plain text 50 → 10.5, `<`
// 284 → 10.5, accented 162 → 52, Japanese 118 → 45, control characters
// 337 → 209 (each \u00XX; one every other byte 168 → 171), lines of 21
// bytes 31, tab-separated columns 68.
func appendEntry(out []byte, e abi.MemoryEntry) ([]byte, error) {
	out = append(out, `{"key":`...)
	out = jsonstr.AppendMinimal(out, e.Key)
	out = append(out, `,"content":`...)
	out = jsonstr.AppendMinimal(out, e.Content)
	if e.Category != "" {
		out = append(out, `,"category":`...)
		out = jsonstr.AppendMinimal(out, e.Category)
	}
	if e.SessionID != "" {
		out = append(out, `,"session_id":`...)
		out = jsonstr.AppendMinimal(out, e.SessionID)
	}
	if e.Timestamp != 0 {
		out = append(out, `,"timestamp":`...)
		out = strconv.AppendInt(out, e.Timestamp, 10)
	}
	if e.Score != nil {
		b, err := json.Marshal(*e.Score) // refuses NaN and the infinities
		if err != nil {
			return nil, err
		}
		out = append(out, `,"score":`...)
		out = append(out, b...)
	}
	return append(out, '}'), nil
}
