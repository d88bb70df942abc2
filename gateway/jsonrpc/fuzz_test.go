package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"testing"
	"unicode/utf8"
)

// FuzzFrames runs arbitrary bytes through the frame reader (with a small
// limit and reads of varying sizes) and every frame through Classify, and
// checks both against simple reference implementations built on
// bytes.Split and encoding/json maps.
func FuzzFrames(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), uint8(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		const max = 96
		src := &countingReader{t: t, data: data, chunk: int(chunk%16) + 1, max: max}
		fr := NewFrameReader(src, max, 0)
		want := refFrames(data, max)
		for i := 0; ; i++ {
			got, err := fr.ReadFrame()
			if i >= len(want) {
				if err == nil {
					t.Fatalf("extra frame %q", got)
				}
				if !errors.Is(err, io.EOF) {
					t.Fatalf("error %v, want EOF", err)
				}
				return
			}
			w := want[i]
			if w.tooLarge {
				if !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("frame %d: got %q, %v; want ErrFrameTooLarge", i, got, err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, w.frame) {
				t.Fatalf("frame %d: got %q, %v; want %q", i, got, err, w.frame)
			}
			checkClassify(t, got)
		}
	})
}

// FuzzClassify checks Classify alone on whole inputs, without framing.
func FuzzClassify(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	for _, s := range envelopeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkClassify(t, data)
	})
}

var fuzzSeeds = []string{
	`{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":1},"id":1}` + "\n",
	`{"jsonrpc":"2.0","result":{"protocolVersion":1},"id":1}` + "\r\n",
	`{"jsonrpc":"2.0","method":"session/update","params":{"session_id":"s"}}` + "\n\n  \n",
	`{"jsonrpc":"2.0","id":"zc-out-0","result":null}` + "\n",
	`{"jsonrpc":"2.0","id":"zc-out-0","error":{"code":-32000,"message":"x","data":{"reason":"not_found"}}}`,
	`[{"jsonrpc":"2.0","method":"status","id":1}]` + "\n",
	`{"jsonrpc":"1.0","method":"status","id":7}` + "\n",
	`{"jsonrpc":"2.0","method":5,"id":"a"}` + "\n",
	`{"jsonrpc":"2.0","method":"m","params":"x","id":[1]}` + "\n",
	`{"jsonrpc":"2.0","method":"m","result":1,"id":2}` + "\n",
	`{"jsonrpc":"2.0","result":1,"error":{"code":1,"message":"m"},"id":2}` + "\n",
	`{"jsonrpc":"2.0","error":{"code":1.5,"message":"m"},"id":2}` + "\n",
	`{"jsonrpc":"2.0","result":1,"params":{},"id":2}` + "\n",
	`{"jsonrpc":"2.0","result":1,"id":true}` + "\n",
	`{"jsonrpc":"2.0","id":null,"result":1}` + "\n",
	`{"\u006aSONRPC":"2.0","\u006dethod":"x\u002fy","id":1e3}` + "\n",
	`{"jsonrpc":"2.0","method":"a","id":-0.5e+3,"params":[]}` + "\n",
	"{not json}\n",
	"   \t\r\n\n",
	`"just a string"` + "\n" + "null\n" + "12\n",
	`{"jsonrpc":"2.0","method":"x","params":{"a":"` + string(bytes.Repeat([]byte("z"), 120)) + `"}}` + "\n{}\n",
	`{"jsonrpc":"2.0","method":"m","id":"\ud800","params":{}}` + "\n",
	`{"jsonrpc":"2.0","method":"m","id":1,"id":"two"}` + "\n",
	`{"jsonrpc":"2.0","id":1,"method":"status","method":"config/delete"}` + "\n",
	`{"jsonrpc":"2.0","id":1,"method":"status","\u006dethod":"config/delete"}` + "\n",
	`{"jsonrpc":"2.0","id":"zc-out-0","result":1,"r\u0065sult":2}` + "\n",
	`{"jsonrpc":"2.0","params":{"method":1,"method":2},"method":"m","x":1,"x":2}` + "\n",
	// At FuzzFrames' limit of 96: with a CR, with two, and with one at the end.
	string(bytes.Repeat([]byte("a"), 96)) + "\r\n" + string(bytes.Repeat([]byte("b"), 96)) + "\r\r\n",
	string(bytes.Repeat([]byte("c"), 95)) + "\r\r\n" + string(bytes.Repeat([]byte("d"), 96)) + "\r",
	string(bytes.Repeat([]byte("e"), 96)) + "x\n",
}

// countingReader yields data in chunks of varying size and fails the test
// if it is ever asked for bytes beyond max+1 past the current frame's first
// byte (the byte after the latest LF it has handed out), or max+2 once it
// has handed out a CR as the byte past max (the LF may follow it).
type countingReader struct {
	t     *testing.T
	data  []byte
	pos   int
	chunk int
	turn  int
	max   int
}

func (r *countingReader) Read(p []byte) (int, error) {
	frameStart := bytes.LastIndexByte(r.data[:r.pos], '\n') + 1
	bound := r.max + 1
	if r.pos > frameStart+r.max && r.data[frameStart+r.max] == '\r' {
		bound++
	}
	if r.pos+len(p) > frameStart+bound {
		r.t.Fatalf("asked for %d bytes at %d; the frame began at %d, limit %d", len(p), r.pos, frameStart, bound)
	}
	if r.pos >= len(r.data) {
		return 0, io.EOF
	}
	r.turn++
	n := min(len(p), len(r.data)-r.pos, r.chunk+r.turn%3)
	copy(p, r.data[r.pos:r.pos+n])
	r.pos += n
	return n, nil
}

type refFrame struct {
	frame    []byte
	tooLarge bool
}

// refFrames is the reference framer: split on LF, trim, skip blanks, stop
// at the first line longer than max, not counting one CR that ends it.
func refFrames(data []byte, max int) []refFrame {
	var out []refFrame
	lines := bytes.Split(data, []byte("\n"))
	for _, line := range lines {
		if len(line) > max && (len(line) > max+1 || line[max] != '\r') {
			return append(out, refFrame{tooLarge: true})
		}
		if t := bytes.Trim(line, " \t\r\n"); len(t) > 0 {
			out = append(out, refFrame{frame: t})
		}
	}
	return out
}

// checkClassify compares Classify with refClassify and checks that every
// reply and every re-encoded message is one valid frame.
func checkClassify(t *testing.T, frame []byte) {
	t.Helper()
	m := Classify(frame)
	ref := refClassify(frame)
	// As a connection classifies it, with the method names it used last:
	// the frame's own kept by a first classification, then taken from
	// them, each time the same message.
	var names methodNames
	for range 2 {
		c := classify(frame, &names)
		if c.Kind != m.Kind || (c.Request != nil && c.Request.Method != m.Request.Method) {
			t.Fatalf("classify(%q) with names %q: %v %+v, Classify %v %+v", frame, names.names, c.Kind, c.Request, m.Kind, m.Request)
		}
	}
	// And as the read loop classifies it: into the connection's Request,
	// its id a view of the frame, the same message; moved out of it
	// (keep), the same request once the frame is written over, as is an
	// invalid frame's reply.
	var into Request
	buf := bytes.Clone(frame)
	c := classifyInto(buf, &names, &into)
	if c.Kind != m.Kind || (c.Request != nil && (c.Request != &into || c.Request.Method != m.Request.Method ||
		!sameID(c.Request.ID, m.Request.ID) || !bytes.Equal(c.Request.Params, m.Request.Params))) ||
		(c.Reply != nil && (m.Reply == nil || !sameID(c.Reply.ID, m.Reply.ID))) {
		t.Fatalf("classifyInto(%q): %v %+v, Classify %v %+v", frame, c.Kind, c.Request, m.Kind, m.Request)
	}
	var kept *Request
	if c.Request != nil {
		kept = keep(c.Request)
	}
	for i := range buf {
		buf[i] = 'X'
	}
	if kept != nil && (kept.idView || !sameID(kept.ID, m.Request.ID) || kept.Method != m.Request.Method) {
		t.Fatalf("classifyInto(%q) kept: %+v, Classify %+v", frame, kept, m.Request)
	}
	if c.Reply != nil && !sameID(c.Reply.ID, m.Reply.ID) {
		t.Fatalf("classifyInto(%q) reply id %v once the frame is written over, Classify's %v", frame, c.Reply.ID, m.Reply.ID)
	}
	if m.Kind != ref.kind {
		t.Fatalf("Classify(%q) kind %v (%s), reference %v (%s)", frame, m.Kind, m.Problem, ref.kind, ref.problem)
	}
	switch m.Kind {
	case KindInvalid:
		if (m.Reply == nil) != (ref.replyCode == 0) {
			t.Fatalf("Classify(%q) reply %+v, reference code %d", frame, m.Reply, ref.replyCode)
		}
		if m.Problem == "" {
			t.Fatalf("Classify(%q): no problem", frame)
		}
		if m.Reply != nil {
			if m.Reply.Error.Code != ref.replyCode || !sameID(m.Reply.ID, ref.id) {
				t.Fatalf("Classify(%q) reply %d id %v, reference %d id %v", frame, m.Reply.Error.Code, m.Reply.ID, ref.replyCode, ref.id)
			}
			checkWire(t, m.Reply)
		}
	case KindRequest, KindNotification:
		r := m.Request
		if r.Method != ref.method || !sameID(r.ID, ref.id) || len(r.Params) == 0 {
			t.Fatalf("Classify(%q) = %+v, reference %+v", frame, r, ref)
		}
		b, _ := r.MarshalJSON()
		again := Classify(b)
		if again.Kind != m.Kind || again.Request.Method != r.Method || !sameID(again.Request.ID, r.ID) {
			t.Fatalf("round trip of %q: %q is %v", frame, b, again.Kind)
		}
	case KindResponse:
		r := m.Response
		if (r.Error == nil) == (r.Result == nil) || !sameID(r.ID, ref.id) {
			t.Fatalf("Classify(%q) = %+v, reference %+v", frame, r, ref)
		}
		if r.Error != nil && (r.Error.Code != ref.errCode || r.Error.Message != ref.errMsg) {
			t.Fatalf("Classify(%q) error %+v, reference %d %q", frame, r.Error, ref.errCode, ref.errMsg)
		}
		checkWire(t, r)
	}
}

func checkWire(t *testing.T, r *Response) {
	t.Helper()
	b, err := r.MarshalJSON()
	if err != nil || !json.Valid(b) || bytes.IndexByte(b, '\n') >= 0 {
		t.Fatalf("response encodes as %q, %v", b, err)
	}
	again := Classify(b)
	if again.Kind != KindResponse || !sameID(again.Response.ID, plainID(r.ID)) {
		t.Fatalf("response %q classifies as %v (%s)", b, again.Kind, again.Problem)
	}
}

// plainID is id as a response carrying it is read back: its value, not
// its literal.
func plainID(id *ID) *ID {
	if id == nil || *id == (ID{}) {
		return nil
	}
	v := ID{str: id.str, text: id.text}
	return &v
}

func sameID(a, b *ID) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

type refResult struct {
	kind      Kind
	problem   string
	replyCode int64
	id        *ID
	method    string
	errCode   int64
	errMsg    string
}

// refClassify is docs/spec.md §2 written the obvious way, on encoding/json.
func refClassify(b []byte) refResult {
	if !json.Valid(b) {
		return refResult{kind: KindInvalid, replyCode: CodeParseError, problem: "invalid JSON"}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return refResult{kind: KindInvalid, replyCode: CodeInvalidRequest, problem: "not an object"}
	}
	str := func(raw json.RawMessage) (string, bool) {
		var s string
		if len(raw) == 0 || raw[0] != '"' {
			return "", false
		}
		return s, json.Unmarshal(raw, &s) == nil
	}
	// A request's id keeps its literal (to answer with); null is an id
	// of a request, none of a response.
	id := func(raw json.RawMessage, request bool) (*ID, bool) {
		if raw == nil {
			return nil, true
		}
		if string(raw) == "null" {
			if request {
				return &ID{}, true
			}
			return nil, true
		}
		if raw[0] == '"' && !utf8.Valid(raw) {
			return nil, false
		}
		if s, ok := str(raw); ok {
			v := StringID(s)
			if request && bytes.IndexByte(raw, '\\') >= 0 {
				v.raw = string(raw)
			} else if request {
				v.verbatim = true
			}
			return &v, true
		}
		if raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9') {
			v := ID{text: string(raw)}
			return &v, true
		}
		return nil, false
	}
	dups := refDuplicates(b)
	v, _ := str(m["jsonrpc"])
	versionOK := v == "2.0" && !dups["jsonrpc"]
	rawID, hasID := m["id"]
	if dups["id"] {
		rawID = json.RawMessage("true") // ambiguous: never an id
	}
	anyDup := len(dups) > 0
	_, hasResult := m["result"]
	_, hasError := m["error"]
	if rawMethod, ok := m["method"]; ok {
		rid, idOK := id(rawID, true)
		bad := func(p string) refResult {
			return refResult{kind: KindInvalid, replyCode: CodeInvalidRequest, id: rid, problem: p}
		}
		method, isStr := str(rawMethod)
		params, hasParams := m["params"]
		switch {
		case anyDup:
			return bad("duplicate")
		case !versionOK:
			return bad("version")
		case !isStr:
			return bad("method")
		case hasParams && params[0] != '{' && params[0] != '[':
			return bad("params")
		case !idOK:
			return bad("id")
		case hasResult || hasError:
			return bad("result")
		}
		if !hasID {
			return refResult{kind: KindNotification, method: method}
		}
		return refResult{kind: KindRequest, method: method, id: rid}
	}
	drop := refResult{kind: KindInvalid, problem: "response"}
	_, hasParams := m["params"]
	rid, idOK := id(rawID, false)
	if anyDup || !versionOK || !hasID || !idOK || hasParams || hasResult == hasError {
		return drop
	}
	out := refResult{kind: KindResponse, id: rid}
	if hasError {
		var eo map[string]json.RawMessage
		if json.Unmarshal(m["error"], &eo) != nil || eo == nil {
			return drop
		}
		code, err := strconv.ParseInt(string(eo["code"]), 10, 64)
		msg, ok := str(eo["message"])
		if err != nil || !ok {
			return drop
		}
		out.errCode, out.errMsg = code, msg
	}
	return out
}

// refDuplicates walks the top-level keys of a valid JSON object with
// encoding/json's tokenizer (which unescapes them) and returns the
// envelope keys that occur more than once.
func refDuplicates(b []byte) map[string]bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen, dups := map[string]bool{}, map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return dups
		}
		key, _ := tok.(string)
		switch key {
		case "jsonrpc", "id", "method", "params", "result", "error":
			if seen[key] {
				dups[key] = true
			}
			seen[key] = true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return dups
		}
	}
	return dups
}
