package provider

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// DefaultMaxEventBytes bounds one server-sent event: its data and any
// single line, comments included.
const DefaultMaxEventBytes = 4 << 20

// ErrEventTooLarge is returned by SSEReader.Next for an event (or a line)
// longer than the reader's bound.
var ErrEventTooLarge = errors.New("server-sent event too large")

// Event is one dispatched server-sent event.
type Event struct {
	// Type is the event field's value, "message" when the event had none.
	Type string
	// Data is the event's data lines joined with "\n".
	Data string
	// LastEventID is the last event ID seen up to this event.
	LastEventID string
}

// SSEReader reads server-sent events as the HTML standard's "event stream
// interpretation" says
// (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
//
//   - one byte order mark at the start of the stream is skipped;
//   - lines end with CRLF, LF or CR;
//   - a line starting with ':' is a comment;
//   - "field: value" (one space after the colon is dropped; a line without
//     a colon is a field with an empty value); the fields event, data, id
//     and retry are known, others are ignored; data lines are joined with
//     "\n"; an id holding NUL is ignored; retry is ignored as well, since a
//     chat completion is never reconnected to;
//   - a blank line dispatches the event; an event with no data is not
//     dispatched; an event the stream ends inside is discarded.
//
// Invalid UTF-8 is replaced with U+FFFD (a run of bad bytes with one).
// An event's data, and any one line, may not pass the reader's bound.
type SSEReader struct {
	br  *bufio.Reader
	max int

	started bool // the BOM check was done
	afterCR bool // the last line ended with CR: a following LF is part of it

	line   []byte
	data   []byte
	typ    []byte
	lastID string
	idBuf  string
}

// NewSSEReader reads events from r, each at most maxBytes (when <= 0,
// DefaultMaxEventBytes).
func NewSSEReader(r io.Reader, maxBytes int) *SSEReader {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxEventBytes
	}
	return &SSEReader{br: bufio.NewReaderSize(r, 32<<10), max: maxBytes}
}

// Next returns the next dispatched event. At the end of the stream it
// returns io.EOF (a partial event is discarded); a read error is returned
// as it is.
func (r *SSEReader) Next() (Event, error) {
	typ, data, err := r.next()
	if err != nil {
		return Event{}, err
	}
	ev := Event{Type: "message", Data: string(data), LastEventID: r.lastID}
	if len(typ) > 0 {
		ev.Type = string(typ)
	}
	return ev, nil
}

// next is Next without the strings: the event's type ("" for none) and
// data as bytes, valid UTF-8 (bad bytes replaced as Next's are), which
// stay valid only until the following call. A provider decoding each
// event's data as JSON reads it from here, where Next's Data cost a
// copy of the data (two, with the UTF-8 check's), and the decoder a
// third back into bytes.
func (r *SSEReader) next() (typ, data []byte, err error) {
	if !r.started {
		r.started = true
		if b, err := r.br.Peek(3); err == nil && bytes.Equal(b, []byte("\xEF\xBB\xBF")) {
			_, _ = r.br.Discard(3)
		}
	}
	for {
		line, err := r.readLine()
		if err != nil {
			return nil, nil, err
		}
		if len(line) == 0 {
			if typ, data, ok := r.dispatch(); ok {
				return typ, data, nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			name, value = line[:i], line[i+1:]
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(name) {
		case "event":
			r.typ = append(r.typ[:0], value...)
		case "data":
			if len(r.data)+len(value)+1 > r.max {
				return nil, nil, fmt.Errorf("%w: more than %d bytes of data", ErrEventTooLarge, r.max)
			}
			r.data = append(r.data, value...)
			r.data = append(r.data, '\n')
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.idBuf = string(bytes.ToValidUTF8(value, []byte("\uFFFD")))
			}
		}
	}
}

// dispatch ends the event being built; ok is false when it had no data.
// typ and data are the reader's buffers, valid until the next event is
// read.
func (r *SSEReader) dispatch() (typ, data []byte, ok bool) {
	r.lastID = r.idBuf
	typ = r.typ
	r.typ = r.typ[:0]
	if len(r.data) == 0 {
		return nil, nil, false
	}
	data = r.data[:len(r.data)-1] // the LF after the last data line
	r.data = r.data[:0]
	return validUTF8(typ), validUTF8(data), true
}

// validUTF8 is b with each run of invalid UTF-8 replaced by U+FFFD, as
// bytes.ToValidUTF8 makes it; b itself, uncopied, when it is valid (the
// stream of a provider that sends what it should).
func validUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return bytes.ToValidUTF8(b, []byte("\uFFFD"))
}

// readLine returns the next line without its end. A line the stream ends
// inside is incomplete: readLine returns io.EOF instead.
func (r *SSEReader) readLine() ([]byte, error) {
	r.line = r.line[:0]
	if r.afterCR {
		r.afterCR = false
		b, err := r.br.ReadByte()
		if err != nil {
			return nil, err
		}
		if b != '\n' {
			_ = r.br.UnreadByte()
		}
	}
	for {
		if r.br.Buffered() == 0 {
			if _, err := r.br.Peek(1); err != nil {
				return nil, err
			}
		}
		avail, _ := r.br.Peek(r.br.Buffered())
		i := bytes.IndexAny(avail, "\r\n")
		n := i
		if i < 0 {
			n = len(avail)
		}
		if len(r.line)+n > r.max {
			return nil, fmt.Errorf("%w: a line of more than %d bytes", ErrEventTooLarge, r.max)
		}
		r.line = append(r.line, avail[:n]...)
		if i < 0 {
			_, _ = r.br.Discard(n)
			continue
		}
		r.afterCR = avail[i] == '\r'
		_, _ = r.br.Discard(i + 1)
		return r.line, nil
	}
}
