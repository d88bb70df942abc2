package provider

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
)

// readAll reads every event of a stream, and the error that ended it.
func readAll(r io.Reader, maxBytes int) ([]Event, error) {
	sr := NewSSEReader(r, maxBytes)
	var out []Event
	for {
		ev, err := sr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return out, err
		}
		out = append(out, ev)
	}
}

func msg(data string) Event { return Event{Type: "message", Data: data} }

// The event stream interpretation of the HTML standard, rule by rule.
func TestSSEReader(t *testing.T) {
	cases := []struct {
		name, in string
		want     []Event
	}{
		{"one event", "data: hello\n\n", []Event{msg("hello")}},
		{"multi-line data joined with LF", "data: a\ndata: b\ndata:\ndata: c\n\n", []Event{msg("a\nb\n\nc")}},
		{"CRLF line ends", "data: a\r\ndata: b\r\n\r\n", []Event{msg("a\nb")}},
		{"CR line ends", "data: a\rdata: b\r\r", []Event{msg("a\nb")}},
		{"mixed line ends", "data: a\r\ndata: b\rdata: c\n\r\n", []Event{msg("a\nb\nc")}},
		{"a leading BOM is skipped", "\xEF\xBB\xBFdata: x\n\n", []Event{msg("x")}},
		{"a second BOM is part of a field name", "\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\ndata: y\n\n", []Event{msg("y")}},
		{"comments are ignored", ": keep-alive\n:\ndata: x\n: between\n\n", []Event{msg("x")}},
		{"one space after the colon is dropped", "data:x\ndata:  y\n\n", []Event{msg("x\n y")}},
		{"a field without a colon has an empty value", "data\n\n", []Event{msg("")}},
		{"event names the type", "event: error\ndata: bad\n\ndata: next\n\n",
			[]Event{{Type: "error", Data: "bad"}, msg("next")}},
		{"an empty event field means message", "event:\ndata: x\n\n", []Event{msg("x")}},
		{"the last event id carries over", "id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n",
			[]Event{{Type: "message", Data: "a", LastEventID: "7"}, {Type: "message", Data: "b", LastEventID: "7"}, msg("c")}},
		{"an id holding NUL is ignored", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
			[]Event{{Type: "message", Data: "a", LastEventID: "1"}, {Type: "message", Data: "b", LastEventID: "1"}}},
		{"no data, no event", "event: ping\n\nid: 3\n\n\n\ndata: x\n\n", []Event{{Type: "message", Data: "x", LastEventID: "3"}}},
		{"the type does not outlive an event without data", "event: ping\n\ndata: x\n\n", []Event{msg("x")}},
		{"unknown fields and retry are ignored", "retry: 100\nfoo: bar\nData: no\ndata: x\n\n", []Event{msg("x")}},
		{"an event the stream ends inside is dropped", "data: a\n\ndata: b\n", []Event{msg("a")}},
		{"a line the stream ends inside is dropped", "data: a\n\ndata: b", []Event{msg("a")}},
		{"invalid UTF-8 is replaced", "data: a\xffb\n\n", []Event{msg("a\uFFFDb")}},
		{"OpenAI's shape", "data: {\"x\":1}\n\ndata: [DONE]\n\n", []Event{msg(`{"x":1}`), msg("[DONE]")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got, err := readAll(r, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("events %q, want %q", got, tc.want)
				}
			}
		})
	}
}

// An event's data and any one line are bounded; what came before is
// still read.
func TestSSEReaderBound(t *testing.T) {
	for name, in := range map[string]string{
		"data":    "data: ok\n\n" + strings.Repeat("data: 0123456789\n", 10) + "\n",
		"line":    "data: ok\n\n" + "data: " + strings.Repeat("x", 200) + "\n\n",
		"comment": "data: ok\n\n:" + strings.Repeat("x", 200),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := readAll(strings.NewReader(in), 64)
			if !errors.Is(err, ErrEventTooLarge) || !reflect.DeepEqual(got, []Event{msg("ok")}) {
				t.Fatalf("events %q, err %v", got, err)
			}
		})
	}
}

// lineEnd splits a stream into lines as the standard says.
var lineEnd = regexp.MustCompile("\r\n|\r|\n")

// referenceEvents is the standard's algorithm read literally over a whole
// stream, for the fuzz target to compare the reader with.
func referenceEvents(in []byte) []Event {
	in = bytes.TrimPrefix(in, []byte("\xEF\xBB\xBF"))
	lines := lineEnd.Split(string(in), -1)
	lines = lines[:len(lines)-1] // the text after the last line end is no line
	var out []Event
	var data, typ, idBuf, lastID string
	for _, line := range lines {
		switch {
		case line == "":
			lastID = idBuf
			if data == "" {
				typ = ""
				continue
			}
			ev := Event{Type: "message", Data: strings.ToValidUTF8(strings.TrimSuffix(data, "\n"), "\uFFFD"), LastEventID: lastID}
			if typ != "" {
				ev.Type = strings.ToValidUTF8(typ, "\uFFFD")
			}
			out = append(out, ev)
			data, typ = "", ""
		case line[0] == ':':
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				typ = value
			case "data":
				data += value + "\n"
			case "id":
				if !strings.Contains(value, "\x00") {
					idBuf = strings.ToValidUTF8(value, "\uFFFD")
				}
			}
		}
	}
	return out
}

// FuzzSSEReader compares the reader with the literal algorithm, read
// whole and one byte at a time; with a small bound it may stop early with
// ErrEventTooLarge, never with a wrong event or one past the bound.
func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{
		"data: a\ndata: b\n\n", "data: a\r\n\r\n", "data: a\r\rdata: b\r\n\n", "\xEF\xBB\xBFdata: x\n\n",
		": c\nevent: e\nid: 1\ndata\n\n", "data: x\n", "id: a\x00b\ndata: y\n\n", "data:\xff\xfe\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want := referenceEvents(in)
		for _, r := range []io.Reader{bytes.NewReader(in), iotest.OneByteReader(bytes.NewReader(in))} {
			got, err := readAll(r, 1<<20)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if len(got) != len(want) || (len(got) > 0 && !reflect.DeepEqual(got, want)) {
				t.Fatalf("input %q:\n got %q\nwant %q", in, got, want)
			}
		}
		const small = 16
		got, err := readAll(bytes.NewReader(in), small)
		if err != nil && !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("read with a bound: %v", err)
		}
		if len(got) > len(want) || (len(got) > 0 && !reflect.DeepEqual(got, want[:len(got)])) {
			t.Fatalf("input %q with a bound:\n got %q\nwant a prefix of %q", in, got, want)
		}
		for _, ev := range got {
			if len(ev.Data) > small*3 { // U+FFFD is three bytes for one bad byte
				t.Fatalf("event of %d bytes passed the bound", len(ev.Data))
			}
		}
	})
}
