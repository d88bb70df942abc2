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
	const (
		keyField      = `{"key":`
		contentField  = `,"content":`
		categoryField = `,"category":`
	)
	size := len("[]")
	for i, e := range entries {
		if err := ctx.Err(); err != nil {
			return "", 0, fmt.Errorf("recall answer: %w", err)
		}
		if i > 0 {
			size++
		}
		size += len(keyField) + jsonstr.Len(e.GetKey()) + len(contentField) + jsonstr.Len(e.GetContent()) + len("}")
		if c := e.GetCategory(); c != "" {
			size += len(categoryField) + jsonstr.Len(c)
		}
	}
	b := cutBuilder{out: make([]byte, 0, min(size, room)), room: room}
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
		b.str(e.GetKey())
		b.raw(contentField)
		b.str(e.GetContent())
		if c := e.GetCategory(); c != "" {
			b.raw(categoryField)
			b.str(c)
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

// str appends s as a JSON string, as much of it as fits.
func (b *cutBuilder) str(s string) {
	left := b.room - len(b.out)
	if left <= 0 {
		return
	}
	// Fit stops at left: a long string is not measured whole again.
	if fit, _ := jsonstr.Fit(s, left-2); fit == len(s) {
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
