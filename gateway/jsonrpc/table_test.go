package jsonrpc

import (
	"encoding/json"
	"fmt"
	"testing"

	"go.uber.org/zap/zapcore"
)

// wireCase is one row of docs/spec.md §2: frames in, the reply out (or silence).
type wireCase struct {
	name string
	in   string
	// silent: no reply at all. Otherwise the reply has id wantID (raw
	// JSON) and either wantResult (raw JSON) or the error code wantCode.
	silent     bool
	wantID     string
	wantResult string
	wantCode   int64
	wantMsg    string // checked when set
}

var wireCases = []wireCase{
	// Framing.
	{name: "request", in: `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":1}}`, wantID: `1`, wantResult: `{"a":1}`},
	{name: "trailing CR", in: `{"jsonrpc":"2.0","id":2,"method":"echo","params":[2]}` + "\r", wantID: `2`, wantResult: `[2]`},
	{name: "surrounding whitespace", in: " \t" + `{"jsonrpc":"2.0","id":3,"method":"echo","params":{}}` + "  \t\r", wantID: `3`, wantResult: `{}`},
	{name: "blank lines skipped", in: "\n   \n\t\r\n", silent: true},
	{name: "params absent reads as {}", in: `{"jsonrpc":"2.0","id":"p","method":"echo"}`, wantID: `"p"`, wantResult: `{}`},
	{name: "string id", in: `{"jsonrpc":"2.0","id":"zc-out-0","method":"echo","params":[]}`, wantID: `"zc-out-0"`, wantResult: `[]`},
	{name: "number id text kept", in: `{"jsonrpc":"2.0","id":1.50,"method":"echo","params":[]}`, wantID: `1.50`, wantResult: `[]`},
	{name: "escaped keys", in: `{"jsonrpc":"2.0","\u0069d":4,"\u006dethod":"ech\u006f","params":[4]}`, wantID: `4`, wantResult: `[4]`},
	// Invalid JSON and non-objects.
	{name: "invalid JSON", in: `{"jsonrpc":"2.0","id":5,"method":"echo"`, wantID: `null`, wantCode: CodeParseError},
	{name: "not JSON at all", in: `hello`, wantID: `null`, wantCode: CodeParseError},
	{name: "trailing garbage", in: `{"jsonrpc":"2.0","id":5,"method":"echo"} x`, wantID: `null`, wantCode: CodeParseError},
	{name: "batch", in: `[{"jsonrpc":"2.0","id":6,"method":"echo"}]`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "empty batch", in: `[]`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "scalar", in: `42`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "null", in: `null`, wantID: `null`, wantCode: CodeInvalidRequest},
	// Request-shaped, malformed: -32600 with the id when valid.
	{name: "jsonrpc 1.0", in: `{"jsonrpc":"1.0","id":7,"method":"echo"}`, wantID: `7`, wantCode: CodeInvalidRequest},
	{name: "jsonrpc missing", in: `{"id":"a","method":"echo"}`, wantID: `"a"`, wantCode: CodeInvalidRequest},
	{name: "jsonrpc a number", in: `{"jsonrpc":2.0,"id":8,"method":"echo"}`, wantID: `8`, wantCode: CodeInvalidRequest},
	{name: "params a string", in: `{"jsonrpc":"2.0","id":9,"method":"echo","params":"x"}`, wantID: `9`, wantCode: CodeInvalidRequest},
	{name: "params null", in: `{"jsonrpc":"2.0","id":10,"method":"echo","params":null}`, wantID: `10`, wantCode: CodeInvalidRequest},
	{name: "method a number", in: `{"jsonrpc":"2.0","id":11,"method":5}`, wantID: `11`, wantCode: CodeInvalidRequest},
	{name: "method null", in: `{"jsonrpc":"2.0","id":"m","method":null}`, wantID: `"m"`, wantCode: CodeInvalidRequest},
	{name: "method with result", in: `{"jsonrpc":"2.0","id":12,"method":"echo","result":1}`, wantID: `12`, wantCode: CodeInvalidRequest},
	{name: "method with error", in: `{"jsonrpc":"2.0","id":13,"method":"echo","error":{"code":1,"message":"m"}}`, wantID: `13`, wantCode: CodeInvalidRequest},
	{name: "method with bad id", in: `{"jsonrpc":"2.0","id":true,"method":"echo"}`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "method with object id", in: `{"jsonrpc":"2.0","id":{"x":1},"method":"echo","params":"x"}`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "malformed without id", in: `{"jsonrpc":"2.0","method":5}`, wantID: `null`, wantCode: CodeInvalidRequest},
	// Duplicate envelope keys: a request-shaped frame is -32600 with its id
	// when the id itself appears once and is valid, else id null; escaped
	// spellings are the same key.
	{name: "duplicate method", in: `{"jsonrpc":"2.0","id":30,"method":"echo","method":"boom"}`, wantID: `30`, wantCode: CodeInvalidRequest},
	{name: "duplicate method escaped", in: `{"jsonrpc":"2.0","id":31,"method":"echo","\u006dethod":"boom"}`, wantID: `31`, wantCode: CodeInvalidRequest},
	{name: "duplicate jsonrpc", in: `{"jsonrpc":"2.0","jsonrpc":"2.0","id":32,"method":"echo"}`, wantID: `32`, wantCode: CodeInvalidRequest},
	{name: "duplicate params", in: `{"jsonrpc":"2.0","id":33,"method":"echo","params":{},"params":[1]}`, wantID: `33`, wantCode: CodeInvalidRequest},
	{name: "duplicate result in a request", in: `{"jsonrpc":"2.0","id":34,"method":"echo","result":1,"result":2}`, wantID: `34`, wantCode: CodeInvalidRequest},
	{name: "duplicate id", in: `{"jsonrpc":"2.0","id":35,"id":36,"method":"echo"}`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "duplicate id, same value", in: `{"jsonrpc":"2.0","id":37,"\u0069d":37,"method":"echo"}`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "duplicate id null then number", in: `{"jsonrpc":"2.0","id":null,"id":38,"method":"echo"}`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "duplicate method without id", in: `{"jsonrpc":"2.0","method":"echo","method":"boom"}`, wantID: `null`, wantCode: CodeInvalidRequest},
	{name: "duplicate unknown key is not the envelope's", in: `{"jsonrpc":"2.0","id":39,"method":"echo","x":1,"x":2,"params":[39]}`, wantID: `39`, wantResult: `[39]`},
	// Response-shaped, malformed: dropped, no reply.
	{name: "response duplicate result", in: `{"jsonrpc":"2.0","id":"zc-out-5","result":1,"result":2}`, silent: true},
	{name: "response duplicate id", in: `{"jsonrpc":"2.0","id":"zc-out-5","id":"zc-out-6","result":1}`, silent: true},
	{name: "response duplicate error escaped", in: `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"},"\u0065rror":{"code":2,"message":"n"}}`, silent: true},
	{name: "response duplicate jsonrpc", in: `{"jsonrpc":"1.0","jsonrpc":"2.0","id":1,"result":1}`, silent: true},
	{name: "response without jsonrpc", in: `{"id":1,"result":1}`, silent: true},
	{name: "response jsonrpc 1.0", in: `{"jsonrpc":"1.0","id":1,"result":1}`, silent: true},
	{name: "response with result and error", in: `{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}`, silent: true},
	{name: "response with neither", in: `{"jsonrpc":"2.0","id":1}`, silent: true},
	{name: "empty object", in: `{}`, silent: true},
	{name: "error not an object", in: `{"jsonrpc":"2.0","id":1,"error":"bad"}`, silent: true},
	{name: "error code not an integer", in: `{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"m"}}`, silent: true},
	{name: "error code a string", in: `{"jsonrpc":"2.0","id":1,"error":{"code":"1","message":"m"}}`, silent: true},
	{name: "error without message", in: `{"jsonrpc":"2.0","id":1,"error":{"code":1}}`, silent: true},
	{name: "error message not a string", in: `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":2}}`, silent: true},
	{name: "response id a bool", in: `{"jsonrpc":"2.0","id":false,"result":1}`, silent: true},
	{name: "response id an array", in: `{"jsonrpc":"2.0","id":[1],"result":1}`, silent: true},
	{name: "response without id", in: `{"jsonrpc":"2.0","result":1}`, silent: true},
	{name: "response with params", in: `{"jsonrpc":"2.0","id":1,"result":1,"params":{}}`, silent: true},
	// Valid responses nobody is waiting for: logged, ignored.
	{name: "response unknown id", in: `{"jsonrpc":"2.0","id":"zc-out-99","result":{"ok":true}}`, silent: true},
	{name: "error response unknown id", in: `{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"nope"}}`, silent: true},
	{name: "response id null", in: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`, silent: true},
	// Notifications: never answered.
	{name: "notification", in: `{"jsonrpc":"2.0","method":"echo","params":{}}`, silent: true},
	{name: "notification unknown method", in: `{"jsonrpc":"2.0","method":"no/such"}`, silent: true},
	{name: "notification handler error", in: `{"jsonrpc":"2.0","method":"boom"}`, silent: true},
	{name: "notification handler *Error", in: `{"jsonrpc":"2.0","method":"fail"}`, silent: true},
	// "id":null is an id, not a notification (JSON-RPC 2.0: a
	// notification has no id member): answered, with null.
	{name: "request with id null", in: `{"jsonrpc":"2.0","id":null,"method":"no/such"}`, wantID: `null`, wantCode: CodeMethodNotFound, wantMsg: "Unknown method: no/such"},
	{name: "request with id null served", in: `{"jsonrpc":"2.0","id":null,"method":"echo","params":[7]}`, wantID: `null`, wantResult: `[7]`},
	// A string id comes back as it was written, escapes and all: a lone
	// surrogate decodes to U+FFFD, an id the client never sent.
	{name: "id lone surrogate", in: `{"jsonrpc":"2.0","id":"\ud800","method":"echo","params":{}}`, wantID: `"\ud800"`, wantResult: `{}`},
	{name: "id with characters JSON may escape", in: `{"jsonrpc":"2.0","id":"<a&b>` + "\u2028" + `","method":"echo","params":{}}`, wantID: `"<a&b>` + "\u2028" + `"`, wantResult: `{}`},
	{name: "id escaped", in: `{"jsonrpc":"2.0","id":"a\u0062\n","method":"echo","params":{}}`, wantID: `"a\u0062\n"`, wantResult: `{}`},
	{name: "id surrogates reversed", in: `{"jsonrpc":"2.0","id":"\udc00\ud800","method":"no/such"}`, wantID: `"\udc00\ud800"`, wantCode: CodeMethodNotFound},
	// Not UTF-8: it could not be answered as JSON, so it is no id.
	{name: "id not UTF-8", in: `{"jsonrpc":"2.0","id":"a` + "\xff" + `b","method":"echo","params":{}}`, wantID: `null`, wantCode: CodeInvalidRequest},
	// Requests.
	{name: "unknown method", in: `{"jsonrpc":"2.0","id":20,"method":"no/such"}`, wantID: `20`, wantCode: CodeMethodNotFound, wantMsg: "Unknown method: no/such"},
	{name: "result null", in: `{"jsonrpc":"2.0","id":21,"method":"null"}`, wantID: `21`, wantResult: `null`},
	{name: "handler *Error wrapped", in: `{"jsonrpc":"2.0","id":22,"method":"fail"}`, wantID: `22`, wantCode: CodeSessionNotFound, wantMsg: "Session not found"},
	{name: "handler plain error", in: `{"jsonrpc":"2.0","id":23,"method":"boom"}`, wantID: `23`, wantCode: CodeInternal, wantMsg: "Internal error"},
	{name: "handler panic", in: `{"jsonrpc":"2.0","id":24,"method":"panic"}`, wantID: `24`, wantCode: CodeInternal, wantMsg: "Internal error"},
}

// TestWireTable runs every docs/spec.md §2 row through a real Conn on a real Unix
// socket, with handlers inline (strict order) and concurrent. After each
// row a sentinel request is sent; everything the server writes before the
// sentinel's reply (and the row's own reply) is the row's output, so a
// silent row is proven silent without waiting.
func TestWireTable(t *testing.T) {
	for _, mode := range []string{"inline", "concurrent"} {
		t.Run(mode, func(t *testing.T) {
			h := &testHandler{}
			opts := Options{}
			if mode == "inline" {
				opts.Inline = func(string) bool { return true }
			}
			ts := startServer(t, &Server{Options: opts, NewHandler: func(*Conn, Peer) Handler { return h }}, nil)
			c := dial(t, ts.path)
			for i, tc := range wireCases {
				sentinel := fmt.Sprintf(`"sentinel-%d"`, i)
				c.send(tc.in, `{"jsonrpc":"2.0","id":`+sentinel+`,"method":"echo","params":{}}`)
				var got []wireMsg
				sawSentinel := false
				for !sawSentinel || (!tc.silent && len(got) == 0) {
					m := c.recvMsg()
					if string(m.ID) == sentinel {
						sawSentinel = true
						continue
					}
					got = append(got, m)
				}
				checkRow(t, tc, got)
			}
			// Every notification reached the handler, none was answered.
			want := []string{"echo", "no/such", "boom", "fail"}
			checkFor(t, func() error {
				if got := h.notifications(); fmt.Sprint(got) != fmt.Sprint(want) && mode == "inline" {
					return fmt.Errorf("notifications %v, want %v", got, want)
				} else if len(got) != len(want) {
					return fmt.Errorf("notifications %v, want %v", got, want)
				}
				return nil
			})
			// The malformed response frames were logged without content.
			for _, e := range ts.logs.All() {
				for _, f := range e.Context {
					if f.Type == zapcore.StringType && f.Key != "stack" && len(f.String) > 80 {
						t.Errorf("log %q field %s looks like frame content: %q", e.Message, f.Key, f.String)
					}
				}
			}
			for msg, want := range map[string]int{
				"malformed response dropped":              18,
				"response for no pending request ignored": 2,
				"response with id null ignored":           1,
			} {
				if n := ts.logs.FilterMessage(msg).Len(); n != want {
					t.Errorf("%q logged %d times, want %d", msg, n, want)
				}
			}
		})
	}
}

func checkRow(t *testing.T, tc wireCase, got []wireMsg) {
	t.Helper()
	if tc.silent {
		if len(got) > 0 {
			t.Errorf("%s: got %v, want silence", tc.name, got)
		}
		return
	}
	if len(got) != 1 {
		t.Errorf("%s: got %v, want one reply", tc.name, got)
		return
	}
	m := got[0]
	if m.JSONRPC != "2.0" || string(m.ID) != tc.wantID {
		t.Errorf("%s: got %v, want jsonrpc 2.0 and id %s", tc.name, m, tc.wantID)
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal([]byte(m.line), &fields)
	_, hasResult := fields["result"]
	_, hasError := fields["error"]
	if hasResult == hasError {
		t.Errorf("%s: got %v, want exactly one of result and error", tc.name, m)
	}
	if tc.wantCode == 0 {
		if string(m.Result) != tc.wantResult || !hasResult {
			t.Errorf("%s: got %v, want result %s", tc.name, m, tc.wantResult)
		}
		return
	}
	if m.Error == nil || m.Error.Code != tc.wantCode {
		t.Errorf("%s: got %v, want error %d", tc.name, m, tc.wantCode)
		return
	}
	if tc.wantMsg != "" && m.Error.Message != tc.wantMsg {
		t.Errorf("%s: message %q, want %q", tc.name, m.Error.Message, tc.wantMsg)
	}
}

// TestClassifyKinds pins the classifier's verdict on a few frames, beside
// the socket table (which sees only what goes out).
func TestClassifyKinds(t *testing.T) {
	for in, want := range map[string]Kind{
		`{"jsonrpc":"2.0","id":1,"method":"m"}`:           KindRequest,
		`{"jsonrpc":"2.0","method":"m"}`:                  KindNotification,
		`{"jsonrpc":"2.0","id":null,"method":"m"}`:        KindRequest,
		`{"jsonrpc":"2.0","id":1,"result":null}`:          KindResponse,
		`{"jsonrpc":"2.0","id":null,"result":1}`:          KindResponse,
		`{"jsonrpc":"2.0","id":1,"result":1,"error":{}}`:  KindInvalid,
		`  {"jsonrpc":"2.0","id":1,"result":[]}  ` + "\r": KindResponse,
	} {
		if got := Classify([]byte(in)).Kind; got != want {
			t.Errorf("Classify(%s) = %v, want %v", in, got, want)
		}
	}
	m := Classify([]byte(`{"jsonrpc":"2.0","id":"x","result":null}`))
	if string(m.Response.Result) != "null" || m.Response.Error != nil {
		t.Errorf("result null: %+v", m.Response)
	}
	m = Classify([]byte(`{"jsonrpc":"2.0","id":"x","method":"m"}`))
	if string(m.Request.Params) != "{}" || !m.Request.ID.IsString() || m.Request.ID.String() != "x" {
		t.Errorf("params default: %+v", m.Request)
	}
}
