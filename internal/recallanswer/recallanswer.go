// Package recallanswer builds the memory recall tool's answer, the
// entries as a JSON array of {"key","content","category"} (category left
// out when empty): the bytes json.Marshal writes, built only as far as a
// reader is shown, with the size of the whole.
//
// Both ends of the recall use it: the session service for a sandbox that
// answers entries, and the plugin sandbox, which builds the answer itself
// when the session service sends the room it shows (MemoryRecallRequest's
// answer_limit), so that only that start crosses the socket and not the
// whole answer of up to the sandbox's 16 MiB message.
package recallanswer

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// Build returns the start of the answer to a recall of entries, at most
// about room bytes of it, and the size of the whole answer.
//
// As JSON a control character is six bytes: a whole answer to the
// sandbox's 16 MiB message was 96 MiB, built to be cut at once to the
// 1 MiB a client is shown. Only the start every reader takes is built:
// the whole is measured (jsonstr.Len, which writes nothing) for the
// output_bytes and the truncation note the client is given, the same as
// a whole answer's. Room is a bound on bytes as written, and a reader's
// bound on them as JSON is never shorter, so cutting the start gives the
// bytes cutting the whole would. ctx is checked between entries: a caller
// that went away stops the building.
func Build(ctx context.Context, entries []*pluginv1.MemoryEntry, room int) (text string, total int, err error) {
	cut := make([]abi.RecallCutEntry, len(entries))
	for i, e := range entries {
		if err := ctx.Err(); err != nil {
			return "", 0, fmt.Errorf("recall answer: %w", err)
		}
		cut[i] = abi.RecallCutEntry{
			Key: e.GetKey(), Content: e.GetContent(), Category: e.GetCategory(),
			KeyJSON: jsonstr.Len(e.GetKey()), ContentJSON: jsonstr.Len(e.GetContent()), CategoryJSON: jsonstr.Len(e.GetCategory()),
		}
	}
	return BuildCut(ctx, cut, room)
}

// BuildCut is Build from the entries abi.DecodeRecallAnswerCut read for
// room: each string's start that the answer may write, and its whole
// length as JSON. A string past room is never written, only counted: the
// plugin sandbox reads a plugin's answer of up to 16 MiB keeping only
// that, and builds the answer from it without a copy of the whole.
func BuildCut(ctx context.Context, entries []abi.RecallCutEntry, room int) (text string, total int, err error) {
	const (
		keyField      = `{"key":`
		contentField  = `,"content":`
		categoryField = `,"category":`
	)
	size := len("[]")
	for i, e := range entries {
		if i > 0 {
			size++
		}
		size += len(keyField) + e.KeyJSON + len(contentField) + e.ContentJSON + len("}")
		if e.CategoryJSON > len(`""`) {
			size += len(categoryField) + e.CategoryJSON
		}
	}
	// A string cut at the room is written with its closing quote, one
	// byte past it, before the quote is taken back: sized to room, the
	// buffer was grown by a quarter (a copy of the MiB) at that last byte.
	capacity := min(size, room)
	if capacity < size {
		capacity++
	}
	b := cutBuilder{out: make([]byte, 0, capacity), room: room}
	b.raw("[")
	for i, e := range entries {
		if b.full() {
			break
		}
		if err := ctx.Err(); err != nil {
			return "", 0, fmt.Errorf("recall answer: %w", err)
		}
		if i > 0 {
			b.raw(",")
		}
		b.raw(keyField)
		b.str(e.Key, e.KeyJSON)
		b.raw(contentField)
		b.str(e.Content, e.ContentJSON)
		if e.CategoryJSON > len(`""`) {
			b.raw(categoryField)
			b.str(e.Category, e.CategoryJSON)
		}
		b.raw("}")
	}
	b.raw("]")
	// b.out is never written again: the string shares it rather than
	// copy what may be a MiB.
	return unsafe.String(unsafe.SliceData(b.out), len(b.out)), size, nil
}

// cutBuilder writes JSON up to room bytes: what passes room is left out,
// and a string is cut at a character, so out is always the start of what
// writing it all would make, at most room bytes (room less up to five
// when an escape did not fit).
type cutBuilder struct {
	out  []byte
	room int
}

func (b *cutBuilder) full() bool { return len(b.out) >= b.room }

// raw appends s as it is, as much of it as fits.
func (b *cutBuilder) raw(s string) {
	b.out = append(b.out, s[:min(len(s), max(0, b.room-len(b.out)))]...)
}

// str appends s as a JSON string, as much of it as fits; jsonLen is the
// length of the whole string's JSON, of which s may be only the start
// (at least the bytes that fit, and a character across the cut).
func (b *cutBuilder) str(s string, jsonLen int) {
	left := b.room - len(b.out)
	if left <= 0 {
		return
	}
	if jsonLen <= left {
		b.out = jsonstr.Append(b.out, s)
		return
	}
	// The opening quote and the part that fits; no closing quote, which
	// the whole string would have written only after the rest.
	fit, _ := jsonstr.Fit(s, left-1)
	b.out = jsonstr.Append(b.out, s[:fit])
	b.out = b.out[:len(b.out)-1]
	// Nothing after a cut string: the bytes left would not follow it in
	// the whole.
	b.room = len(b.out)
}
