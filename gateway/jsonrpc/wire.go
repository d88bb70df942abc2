// Package jsonrpc is the transport engine of the Clawmesh edge: NDJSON
// JSON-RPC 2.0 over a stream socket, as docs/spec.md §2 and §3 fix it.
//
// wire.go holds the message types and the frame classifier, frame.go the
// line reader with its size and time limits, budget.go the memory budget
// unfinished frames share, conn.go one connection (read loop with its
// back-pressure, writer with the write-stall rule, handler dispatch,
// outgoing calls), serve.go the listener side (connection ceiling, peer
// credentials, graceful shutdown) and check.go the params checks every
// method applies (duplicate keys, NUL, depth).
package jsonrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/jsonwalk"
)

// The error codes of docs/spec.md §4.
const (
	CodeParseError      int64 = -32700
	CodeInvalidRequest  int64 = -32600
	CodeMethodNotFound  int64 = -32601
	CodeInvalidParams   int64 = -32602
	CodeInternal        int64 = -32603
	CodeSessionNotFound int64 = -32000
	CodeSessionLimit    int64 = -32001
	CodeSessionBusy     int64 = -32002
	CodeSessionNotOwned int64 = -32003
	CodeConnectionLimit int64 = -32004
	CodeAuthRequired    int64 = -32010
	CodeVersionMismatch int64 = -32011
	CodeForbidden       int64 = -32012
)

// Errors reported by this package. Each is wrapped with %w where more
// detail helps; test with errors.Is.
var (
	// ErrInvalidFrame: a value is not what the wire format allows.
	ErrInvalidFrame = errors.New("jsonrpc: invalid frame")
	// ErrFrameTooLarge: a line exceeded Options.MaxFrameBytes.
	ErrFrameTooLarge = errors.New("jsonrpc: frame too large")
	// ErrFrameTimeout: a started line did not end within Options.FrameTimeout.
	ErrFrameTimeout = errors.New("jsonrpc: frame timeout")
	// ErrInitializeTimeout: MarkInitialized was not called within
	// Options.InitializeTimeout of accept.
	ErrInitializeTimeout = errors.New("jsonrpc: initialize deadline passed")
	// ErrWriteStall: output was pending and the peer read nothing for
	// Options.WriteStallTimeout.
	ErrWriteStall = errors.New("jsonrpc: write stalled")
	// ErrOutputOverBudget: the connection would have queued more output
	// while Options.OutputBudget was spent and it held more than
	// FairOutputShare of it.
	ErrOutputOverBudget = errors.New("jsonrpc: output held for peers over its bound")
	// ErrClosed: the connection is closed. Calls pending at close, and
	// handler contexts, carry an error wrapping it (and the reason).
	ErrClosed = errors.New("jsonrpc: connection closed")
	// ErrPeerClosed: the peer closed the connection.
	ErrPeerClosed = errors.New("jsonrpc: peer closed the connection")
	// ErrCallTimeout: an outgoing call had no answer within
	// Options.CallTimeout. It also matches context.DeadlineExceeded.
	ErrCallTimeout = fmt.Errorf("jsonrpc: call timed out: %w", context.DeadlineExceeded)
	// ErrShutdown: the server is shutting down.
	ErrShutdown = errors.New("jsonrpc: server shutting down")
)

// ID is a JSON-RPC request id: a string, a number or null. A number keeps
// its original JSON text (1, 1.0 and 1e0 are three different ids); a
// string is held decoded, and a request's is answered as it was written
// (verbatim when it has no escape, else raw): a lone surrogate such as
// "\ud800" decodes to U+FFFD, and "<" re-encodes as "\u003c", neither the
// id the client sent. IDs are comparable with == and usable as map keys:
// two ids are equal when kind and textual value agree (the ids compared,
// a response's to an outgoing call's, keep neither). The zero ID is null:
// the id of a request sent with "id":null, answered with it.
type ID struct {
	str      bool
	verbatim bool   // text is the string's literal, quotes left out
	text     string // the decoded string, or the number as written
	raw      string // the string's literal with its escapes, quotes included
}

// StringID returns the string id s.
func StringID(s string) ID { return ID{str: true, text: s} }

// Int64ID returns the number id n.
func Int64ID(n int64) ID { return ID{text: strconv.FormatInt(n, 10)} }

// IsString reports whether the id is a JSON string.
func (id ID) IsString() bool { return id.str }

// String returns the textual value: the decoded string, or the number as
// it was written. It is meant for logs; use == to compare ids.
func (id ID) String() string { return id.text }

// MarshalJSON encodes the id as it goes on the wire.
func (id ID) MarshalJSON() ([]byte, error) { return id.appendJSON(nil), nil }

// UnmarshalJSON accepts a JSON string or number.
func (id *ID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	v, ok := parseID(b, false)
	if !ok {
		return fmt.Errorf("%w: id must be a string or a number", ErrInvalidFrame)
	}
	*id = v
	return nil
}

func (id ID) appendJSON(dst []byte) []byte {
	switch {
	case id.raw != "":
		return append(dst, id.raw...)
	case id.verbatim:
		dst = append(dst, '"')
		dst = append(dst, id.text...)
		return append(dst, '"')
	}
	if id.str {
		return jsonstr.Append(dst, id.text)
	}
	if id.text == "" {
		return append(dst, "null"...)
	}
	return append(dst, id.text...)
}

// parseID reads a raw JSON value as an id, keeping a string's escaped
// spelling when keepRaw (a request's id, to answer with). b must be one
// valid JSON value. A string that is not UTF-8 is not an id: it could be
// neither echoed (the answer would not be JSON) nor decoded as sent.
func parseID(b []byte, keepRaw bool) (ID, bool) {
	if len(b) == 0 {
		return ID{}, false
	}
	switch c := b[0]; {
	case c == '"':
		if !utf8.Valid(b) {
			return ID{}, false
		}
		s, ok := decodeString(b)
		id := ID{str: true, text: s}
		if keepRaw {
			if bytes.IndexByte(b, '\\') >= 0 {
				id.raw = string(b)
			} else {
				id.verbatim = true
			}
		}
		return id, ok
	case c == '-' || (c >= '0' && c <= '9'):
		if !isNumber(b) {
			return ID{}, false
		}
		return ID{text: string(b)}, true
	}
	return ID{}, false
}

// isNumber reports whether b is one JSON number and nothing else, no
// space around it: what valid says of such a b, without its walk.
func isNumber(b []byte) bool { return jsonstr.NumberEnd(b, 0) == len(b) }

// viewID is parseID for a request's id (keepRaw) that reads a number, or
// a string with no escape, as a view of b: its text is b's own bytes, not
// a copy, and stays what it is only while b does. It reports whether the
// id is such a view; any other id is parsed as parseID parses it, into a
// string of its own.
func viewID(b []byte) (id ID, ok, view bool) {
	if len(b) == 0 {
		return ID{}, false, false
	}
	switch c := b[0]; {
	case c == '"':
		if len(b) < 2 || b[len(b)-1] != '"' || bytes.IndexByte(b, '\\') >= 0 || !utf8.Valid(b) {
			id, ok = parseID(b, true)
			return id, ok, false
		}
		return ID{str: true, verbatim: true, text: bytesView(b[1 : len(b)-1])}, true, true
	case c == '-' || (c >= '0' && c <= '9'):
		if !isNumber(b) {
			return ID{}, false, false
		}
		return ID{text: bytesView(b)}, true, true
	}
	return ID{}, false, false
}

// bytesView is b as a string without a copy. The string changes when b's
// bytes do: a request's id read so lives no longer than the frame it was
// read from (see Conn.keep). Go strings are meant to be immutable, which
// is why only the read loop's inline request holds one, answered before
// those bytes are read over.
func bytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// Request is an incoming or outgoing request. ID is nil for a notification.
// Params is never empty after Classify: an absent params reads as {}.
type Request struct {
	ID     *ID
	Method string
	Params json.RawMessage

	// id is where ID points for a request Classify made: the request
	// and its id are one allocation, not two, on every request's path.
	id ID
	// idView says id's text is a view of the frame (viewID), not a
	// string of its own: a request the read loop classified, which
	// Conn.keep gives a text of its own unless it is inline.
	idView bool

	// inline says the request is handled on the read loop
	// (Options.Inline): its Params lie in the read buffer.
	inline bool
	lease  Lease // the buffer of the frame Params lies in, if pooled
	// held is the bytes of an assembled frame (a lease) counted against
	// its connection's maxHeldFrames until the request finishes.
	held int64
}

// returnLease gives the frame's buffer back, once: the lease is cleared,
// so that no second Return puts the buffer in a pool twice (two frames
// would then be assembled in it at once).
func (r *Request) returnLease() {
	r.lease.Return()
	r.lease = Lease{}
}

// IsNotification reports whether the request expects no response.
func (r *Request) IsNotification() bool { return r.ID == nil }

// MarshalJSON encodes the request as one wire frame (without the LF).
func (r *Request) MarshalJSON() ([]byte, error) {
	return appendRequest(nil, r.ID, r.Method, r.Params), nil
}

// Response is a reply to a request. ID is nil for id null. Exactly one of
// Result and Error is set; a Result of JSON null is json.RawMessage("null").
type Response struct {
	ID     *ID
	Result json.RawMessage
	Error  *Error
}

// MarshalJSON encodes the response as one wire frame (without the LF).
func (r *Response) MarshalJSON() ([]byte, error) { return appendResponse(nil, r) }

// Error is a JSON-RPC error object. It implements error; Is compares codes,
// so errors.Is(err, &Error{Code: CodeSessionBusy}) matches any busy error.
type Error struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// NewError returns an error object. data, when not nil, is marshalled into
// Data; a value that cannot be marshalled is left out.
func NewError(code int64, msg string, data any) *Error {
	e := &Error{Code: code, Message: msg}
	if data != nil {
		if raw, ok := data.(json.RawMessage); ok {
			e.Data = raw
		} else if b, err := json.Marshal(data); err == nil {
			e.Data = b
		}
	}
	return e
}

// MethodNotFound is the docs/spec.md §2 reply for an unknown method.
func MethodNotFound(method string) *Error {
	return NewError(CodeMethodNotFound, "Unknown method: "+method, nil)
}

func (e *Error) Error() string {
	return "jsonrpc error " + strconv.FormatInt(e.Code, 10) + ": " + e.Message
}

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t != nil && t.Code == e.Code
}

// Kind says what a frame is.
type Kind uint8

const (
	// KindInvalid is a malformed frame. Message.Reply is the reply docs/spec.md §2
	// prescribes, or nil when the frame must be dropped without a reply.
	KindInvalid Kind = iota
	// KindRequest is a request that expects a response.
	KindRequest
	// KindNotification is a request without an id (or with id null); it is
	// never answered.
	KindNotification
	// KindResponse is a well-formed response.
	KindResponse
)

var kindNames = [...]string{"invalid", "request", "notification", "response"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Message is one classified frame.
type Message struct {
	Kind     Kind
	Request  *Request  // KindRequest, KindNotification
	Response *Response // KindResponse
	// Reply is set for a KindInvalid frame that must be answered: -32700
	// for invalid JSON, -32600 for a batch, a non-object, or a malformed
	// request. A malformed response-shaped frame has no Reply: it is dropped.
	Reply *Response
	// Problem is a static description of what is wrong with a KindInvalid
	// frame, fit for a log field. It never holds frame content.
	Problem string
}

// Classify reads one frame (one line, without its LF; surrounding
// whitespace allowed) and says what it is, per docs/spec.md §2:
//
//   - invalid JSON: -32700, id null;
//   - a JSON array (batch) or any other non-object: -32600, id null;
//   - an object with "method" is request-shaped. It is a request (id a
//     string or number) or a notification (id absent or null) when jsonrpc
//     is "2.0", method a string, params absent or an object or array,
//     neither result nor error is present, and none of the six envelope
//     keys (jsonrpc, id, method, params, result, error; compared after
//     unescaping, so "\u006dethod" is method) appears twice; otherwise
//     -32600 with its id if "id" appears once and is a string or number,
//     else id null;
//   - an object without "method" is response-shaped. It is a response when
//     jsonrpc is "2.0", id is a string, number or null, exactly one of
//     result and error is present, error is {code:integer, message:string},
//     params is absent, and no envelope key appears twice; otherwise it is
//     dropped without a reply.
//
// Duplicate keys are refused because JSON parsers disagree on which
// occurrence wins: a frame must not mean one thing to this classifier and
// another to a log reader or a proxy.
//
// The returned Request and Response alias frame: the caller must not
// modify frame afterwards.
func Classify(frame []byte) Message { return classify(frame, nil) }

// classify is Classify taking a method's name from names, when they hold
// it, instead of allocating it (names may be nil).
func classify(frame []byte, names *methodNames) Message { return classifyInto(frame, names, nil) }

// classifyInto is classify that, when into is not nil, makes a valid
// request or notification in *into (overwriting all of it) instead of in
// an allocation of its own, and reads its id, a number or a string with
// no escape, as a view of frame (viewID): nothing is allocated for a
// request whose method names hold. The read loop classifies every frame
// so, into its connection's Request, and moves what is not answered
// before the next read out of both (Conn.keep).
func classifyInto(frame []byte, names *methodNames, into *Request) Message {
	frame = trimSpace(frame)
	var env envelope
	if !validFrame(frame, &env) {
		return invalid("invalid JSON", nil, CodeParseError, "Parse error")
	}
	switch frame[0] {
	case '{':
	case '[':
		return invalid("batch", nil, CodeInvalidRequest, "Invalid Request: batch requests are not supported")
	default:
		return invalid("not an object", nil, CodeInvalidRequest, "Invalid Request: a frame must be a JSON object")
	}
	if env.has&hasMethod != 0 {
		return env.request(names, into)
	}
	return env.response()
}

func invalid(problem string, id *ID, code int64, msg string) Message {
	return Message{Kind: KindInvalid, Problem: problem,
		Reply: &Response{ID: id, Error: &Error{Code: code, Message: msg}}}
}

func dropped(problem string) Message { return Message{Kind: KindInvalid, Problem: problem} }

const (
	hasJSONRPC = 1 << iota
	hasID
	hasMethod
	hasParams
	hasResult
	hasError
)

// envelope holds the raw top-level members of one frame object.
type envelope struct {
	has                                     uint8
	dup                                     uint8 // keys seen more than once
	jsonrpc, id, method, params, result, er []byte
}

// keyBit is the has* bit of a top-level member's key, raw (quoted), 0
// for a key that is none of the envelope's. validEnvelope asks it only of
// a key that is not an envelope name as written.
func keyBit(key []byte) uint8 {
	bit := envelopeBit(key[1 : len(key)-1])
	if bit == 0 && bytes.IndexByte(key, '\\') >= 0 {
		// An escaped key matches none as written: "\u006dethod" is
		// method once decoded.
		bit = envelopeBit(keyName(key))
	}
	return bit
}

// set records the value of one top-level member whose key's bit is bit
// (0: not an envelope key); validEnvelope calls it, member by member, as
// it checks the frame.
func (e *envelope) set(bit uint8, val []byte) {
	switch bit {
	case hasJSONRPC:
		e.jsonrpc = val
	case hasID:
		e.id = val
	case hasMethod:
		e.method = val
	case hasParams:
		e.params = val
	case hasResult:
		e.result = val
	case hasError:
		e.er = val
	default:
		return
	}
	e.dup |= e.has & bit
	e.has |= bit
}

// envelopeBit is the has* bit of an envelope key's name, 0 for any other.
func envelopeBit(name []byte) uint8 {
	switch string(name) {
	case "jsonrpc":
		return hasJSONRPC
	case "id":
		return hasID
	case "method":
		return hasMethod
	case "params":
		return hasParams
	case "result":
		return hasResult
	case "error":
		return hasError
	}
	return 0
}

// keyName returns a raw quoted key as a string to switch on. The common
// unescaped case does not allocate when used as a switch operand; an
// escaped key is decoded so that "\u006dethod" is method.
func keyName(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	s, _ := decodeString(raw)
	return []byte(s)
}

func (e *envelope) versionOK() bool {
	if e.has&hasJSONRPC == 0 {
		return false
	}
	if string(e.jsonrpc) == `"2.0"` {
		return true
	}
	s, ok := decodeString(e.jsonrpc)
	return ok && s == "2.0"
}

func (e *envelope) request(names *methodNames, into *Request) Message {
	// Recover the id first: every -32600 below carries it when valid. It
	// is kept in a local, not behind a pointer: the request, once valid,
	// holds it in its own allocation (Request.id).
	var v ID
	withID, idOK, view := false, true, false
	if e.dup&hasID != 0 {
		idOK = false // ambiguous: no occurrence is more the id than another
	} else if e.has&hasID != 0 {
		// "id":null is an id (JSON-RPC 2.0: a notification has no id
		// member), answered with null.
		ok := true
		if string(e.id) != "null" {
			if into != nil {
				v, ok, view = viewID(e.id)
			} else {
				v, ok = parseID(e.id, true)
			}
		}
		withID, idOK = ok, ok
	}
	id := func() *ID {
		if !withID {
			return nil
		}
		p := new(ID)
		*p = v
		if view {
			// An invalid frame's reply may be queued past the next
			// read: its id is a string of its own.
			p.text = strings.Clone(p.text)
		}
		return p
	}
	switch {
	case e.dup != 0:
		return invalid("request: duplicate envelope key", id(), CodeInvalidRequest, "Invalid Request: "+dupMessage(e.dup))
	case !e.versionOK():
		return invalid("request: jsonrpc not 2.0", id(), CodeInvalidRequest, `Invalid Request: "jsonrpc" must be "2.0"`)
	case e.method[0] != '"':
		return invalid("request: method not a string", id(), CodeInvalidRequest, `Invalid Request: "method" must be a string`)
	case e.has&hasParams != 0 && e.params[0] != '{' && e.params[0] != '[':
		return invalid("request: params not object or array", id(), CodeInvalidRequest, `Invalid Request: "params" must be an object or an array`)
	case !idOK:
		return invalid("request: bad id", nil, CodeInvalidRequest, `Invalid Request: "id" must be a string, a number or null`)
	case e.has&(hasResult|hasError) != 0:
		return invalid("request: method with result or error", id(), CodeInvalidRequest, `Invalid Request: "method" together with "result" or "error"`)
	}
	method, ok := names.name(e.method)
	if !ok {
		return invalid("request: method not a string", id(), CodeInvalidRequest, `Invalid Request: "method" must be a string`)
	}
	params := json.RawMessage(e.params)
	if e.has&hasParams == 0 {
		params = emptyObject
	}
	req := into
	if req == nil {
		req = new(Request)
	}
	*req = Request{Method: method, Params: params}
	if !withID {
		return Message{Kind: KindNotification, Request: req}
	}
	req.id, req.idView = v, view
	req.ID = &req.id
	return Message{Kind: KindRequest, Request: req}
}

var emptyObject = json.RawMessage("{}")

// methodNames holds the method names a connection's requests used last,
// so that a request of one of them takes its name from here instead of
// allocating it: a client sends a few methods over and over (health, at
// tens of thousands a second). Bounded: a client that sends a new name
// each time replaces them in turn, and allocates each as before.
type methodNames struct {
	names [8]string
	next  int // the slot the next new name takes
}

// name decodes raw, a method's JSON string (quotes included), as
// decodeString does. A name is kept only when it is the very bytes
// between its quotes (no escape, valid UTF-8): those bytes then compare
// with it as they stand (Go compares a []byte converted to a string
// without allocating), and bytes equal to a kept name decode to it.
func (n *methodNames) name(raw []byte) (string, bool) {
	if n == nil || len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return decodeString(raw)
	}
	inner := raw[1 : len(raw)-1]
	for i := range n.names {
		// From the newest: a client's next method is most often its last.
		if s := n.names[(n.next+len(n.names)-1-i)%len(n.names)]; s != "" && s == string(inner) {
			return s, true
		}
	}
	s, ok := decodeString(raw)
	if ok && s != "" && s == string(inner) {
		n.names[n.next] = s
		n.next = (n.next + 1) % len(n.names)
	}
	return s, ok
}

// dupMessage names the first duplicated envelope key in dup.
func dupMessage(dup uint8) string {
	for i, name := range envelopeKeys {
		if dup&(1<<i) != 0 {
			return `"` + name + `" appears more than once`
		}
	}
	return "a key appears more than once"
}

// envelopeKeys are the key names in the order of the has* bits.
var envelopeKeys = [...]string{"jsonrpc", "id", "method", "params", "result", "error"}

func (e *envelope) response() Message {
	switch {
	case e.dup != 0:
		return dropped("response: duplicate envelope key")
	case !e.versionOK():
		return dropped("response: jsonrpc not 2.0")
	case e.has&hasID == 0:
		return dropped("response: no id")
	case e.has&hasParams != 0:
		return dropped("response: params present")
	case e.has&(hasResult|hasError) == 0:
		return dropped("response: neither result nor error")
	case e.has&(hasResult|hasError) == hasResult|hasError:
		return dropped("response: both result and error")
	}
	resp := &Response{}
	if string(e.id) != "null" {
		v, ok := parseID(e.id, false)
		if !ok {
			return dropped("response: bad id")
		}
		resp.ID = &v
	}
	if e.has&hasResult != 0 {
		resp.Result = e.result
	} else {
		er, ok := parseErrorObject(e.er)
		if !ok {
			return dropped("response: malformed error object")
		}
		resp.Error = er
	}
	return Message{Kind: KindResponse, Response: resp}
}

// parseErrorObject reads {code:integer, message:string, data?:any}.
func parseErrorObject(b []byte) (*Error, bool) {
	if b[0] != '{' {
		return nil, false
	}
	var code, msg, data []byte
	for key, val, i, ok := jsonwalk.NextMember(b, 1); ok; key, val, i, ok = jsonwalk.NextMember(b, i) {
		switch string(keyName(key)) {
		case "code":
			code = val
		case "message":
			msg = val
		case "data":
			data = val
		}
	}
	if code == nil || msg == nil || msg[0] != '"' {
		return nil, false
	}
	n, err := strconv.ParseInt(string(code), 10, 64)
	if err != nil {
		return nil, false
	}
	m, ok := decodeString(msg)
	if !ok {
		return nil, false
	}
	return &Error{Code: n, Message: m, Data: data}, true
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && jsonwalk.IsSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && jsonwalk.IsSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// decodeString decodes a raw JSON string (with its quotes).
func decodeString(b []byte) (string, bool) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return "", false
	}
	inner := b[1 : len(b)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), true
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return "", false
	}
	return s, true
}

// appendRequest appends one request frame (without LF). params must be
// compact JSON or empty (left out).
func appendRequest(dst []byte, id *ID, method string, params json.RawMessage) []byte {
	dst = append(dst, `{"jsonrpc":"2.0"`...)
	if id != nil {
		dst = append(dst, `,"id":`...)
		dst = id.appendJSON(dst)
	}
	dst = append(dst, `,"method":`...)
	dst = jsonstr.Append(dst, method)
	if len(params) > 0 {
		dst = append(dst, `,"params":`...)
		dst = append(dst, params...)
	}
	return append(dst, '}')
}

// appendResponse appends one response frame (without LF) with exactly one
// of result and error. Result must be compact JSON; empty means null.
func appendResponse(dst []byte, r *Response) ([]byte, error) {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	if r.ID == nil {
		dst = append(dst, "null"...)
	} else {
		dst = r.ID.appendJSON(dst)
	}
	if r.Error != nil {
		dst = append(dst, `,"error":`...)
		b, err := json.Marshal(r.Error)
		if err != nil {
			return nil, err
		}
		dst = append(dst, b...)
	} else {
		dst = append(dst, `,"result":`...)
		if len(r.Result) == 0 {
			dst = append(dst, "null"...)
		} else {
			dst = append(dst, r.Result...)
		}
	}
	return append(dst, '}'), nil
}
