package jsonrpc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// validSeeds cover every branch of the grammar, the depth limit and the
// places the eight-byte string loop hands over to the byte loop.
var validSeeds = []string{
	``, ` `, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `1e`, `1e+`, `1E-7`, `-12.5e10`, `.5`, `+1`,
	`true`, `tru`, `truex`, `false`, `null`, `nul`, `nulls`,
	`""`, `"a"`, `"abcdefgh"`, `"abcdefghi"`, `"abcdefg\"`, `"\u00e9"`, `"\u00g9"`, `"\u00e"`, `"\x"`, `"\/\b\f\n\r\t"`, `"a\"b"`, `"\\"`, `"\\\"`, `"a\\"b"`, "\"ctrl\x01 then \\n\"", "\"\\n then ctrl\x01\"",
	"\"tab\there\"", "\"nul\x00\"", "\"\xff\xfe invalid utf-8\"", "\"\x1f\"", "\"\x7f\"", `"unterminated`,
	`{}`, `{ }`, `[]`, `[ ]`, `{"a":1}`, `{"a" : 1 , "b":[1,2,{"c":null}]}`, `{"a"}`, `{"a":}`, `{,}`, `{"a":1,}`,
	`[1,]`, `[,1]`, `[1 2]`, `{1:2}`, `{"a":1]`, `[1}`, `[[[]]]`, `[[[]]`, `{} {}`, ` {} `, "\t\r\n[\n]\n", `]`, `}`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	`{"jsonrpc":"2.0","method":"file/upload/chunk","params":{"upload_id":"x","offset":0,"data_b64":"` +
		base64.StdEncoding.EncodeToString([]byte(strings.Repeat("chunk data ", 30))) + `"},"id":3}`,
}

// envelopeSeeds are frames for validEnvelope, the loop that reads a
// frame object's own members: each envelope name as written, near it
// (a prefix, a longer key, an escape, a byte that is not UTF-8, a
// control byte), cut short at every place, a value of every kind with
// numbers at their edges, containers nested to the depth limit counted
// from the frame object, long keys and values, white space everywhere
// JSON allows it and where it does not, duplicate keys, and what may
// follow the object.
var envelopeSeeds = []string{
	`{"jsonrpc":"2.0","method":"health","params":{},"id":1}`,
	` { "jsonrpc" : "2.0" , "method" : "health" , "params" : { } , "id" : 1 } `,
	"\t\r\n{\n\"id\"\n:\n1\r\n}\n\t", "{\"id\":1\f}", "{\u00a0\"id\":1}",
	`{"jsonrpc":"2.0","result":{"ok":true},"id":"a"}`, `{"jsonrpc":"2.0","error":{"code":1,"message":"m"},"id":null}`,
	`{`, `{"`, `{"i`, `{"id`, `{"id"`, `{"id":`, `{"id":1`, `{"id":1,`, `{"id":1,"`, `{"j`, `{"jsonrpc`, `{"jsonrpc"`,
	`{"jsonrpc":`, `{"jsonrpc":"`, `{"jsonrpc":"2.0`, `{"jsonrpc":"2.0"`, `{"jsonrpc":"2.0"}`, `{"jsonrpc":"2.0\"}`,
	`{"jsonrpc":"2.0"x}`, `{"jsonrpc":"2.0\"","id":1}`, `{"jsonrpc":"2.00"}`, `{"jsonrpc":"2."}`, `{"jsonrpc":2.0}`,
	`{"m`, `{"metho`, `{"method`, `{"method"`, `{"method":"`, `{"method":"health`, `{"p`, `{"params`, `{"params":{`,
	`{"params":{}`, `{"params":[`, `{"params":[]`, `{"r`, `{"result`, `{"e`, `{"error`, `{"error"`,
	`{"i":1}`, `{"idx":1}`, `{"id ":1}`, `{"jsonrpc2":1}`, `{"jsonrp":1}`, `{"method\"":1}`, `{"metho\u0064":1}`,
	`{"\u0069d":1}`, `{"\u0069d":1,"id":2}`, `{"i\"d":1}`, `{"\"":1}`, `{"":1}`, `{"\\":1}`, `{"id\\":1}`,
	`{"params\/":1}`, `{"e\rror":1}`, `{"\u006aSONRPC":"2.0"}`, `{"\x":1}`, `{"\u00":1}`,
	"{\"i\xffd\":1}", "{\"\xff\":1}", "{\"id\":\"\xff\"}", "{\"method\":\"\xc3\"}", "{\"\xe9\":1}",
	"{\"id\x00\":1}", "{\"id\":\"\x01\"}", "{\"\tid\":1}", "{\"jsonrpc\":\"2.0\x00\"}", "{\"method\x7f\":1}",
	`{"id":-}`, `{"id":-0}`, `{"id":0}`, `{"id":01}`, `{"id":-01}`, `{"id":1.}`, `{"id":1.0}`, `{"id":.5}`, `{"id":+1}`,
	`{"id":1e}`, `{"id":1e+}`, `{"id":1E+9}`, `{"id":1e-0}`, `{"id":-0.0e-0}`, `{"id":0x1}`, `{"id":Infinity}`,
	`{"id":NaN}`, `{"id":-Infinity}`, `{"id":9223372036854775808}`, `{"id":1e999999}`, `{"id":1 }`, `{"id":1 2}`,
	`{"id":1-}`, `{"id":1.5.5}`, `{"id":00}`, `{"id":-}`, `{"id":- 1}`,
	`{"a":true,"b":false,"c":null}`, `{"id":tru}`, `{"id":truex}`, `{"id":nul}`, `{"id":fals}`, `{"id":True}`,
	`{"id":1,"id":2}`, `{"x":1,"x":2}`, `{"method":"a","method":"b"}`, `{"params":{},"params":[]}`,
	`{"id"}`, `{"id" 1}`, `{"id"::1}`, `{"id":1:}`, `{,}`, `{"id":1,,"x":1}`, `{"id":1,}`, `{"id":1 , }`,
	`{ }`, `{}`, `{} `, `{}x`, `{"a":1}{}`, `{"a":1}}`, `{"a":1},`, `{"a":1}]`, `{"a":[]]}`, `{"a":{}}}`,
	`{"params": [ ] }`, `{"params":{ } }`, `{"params":[ }`, `{"params":{]}`, `{"params":[1,{"a":[{}]}]}`,
	`{"params":{"a":{"b":[1,"x",{"c":null}]}},"id":1}`, `{"params":{"a"}}`, `{"params":{"a":}}`, `{"params":[1,]}`,
	`{1:2}`, `{null:1}`, `{'id':1}`, `{id:1}`,
	`{"` + strings.Repeat("k", 200) + `":1}`, `{"id` + strings.Repeat("d", 100) + `":1}`,
	`{"method":"` + strings.Repeat("m", 300) + `","id":"` + strings.Repeat("i", 70) + `"}`,
	`{"method":"` + strings.Repeat("m", 300) + `\n` + strings.Repeat("m", 300) + `"}`,
	`{"` + strings.Repeat("k", 70) + `\u0041":"` + strings.Repeat("v", 70) + "\x01" + `"}`,
	`{"params":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`,
	`{"params":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	`{"a":1,"params":` + strings.Repeat(`{"a":`, 9998) + `{}` + strings.Repeat("}", 9998) + `}`,
	`{"a":1,"params":` + strings.Repeat(`{"a":`, 9999) + `{}` + strings.Repeat("}", 9999) + `}`,
	`{"params":` + strings.Repeat("[", 9998) + `{}` + strings.Repeat("]", 9998) + `}`,
	`{"params":` + strings.Repeat("[", 9999) + `{}` + strings.Repeat("]", 9999) + `}`,
}

// validAsFrame is validFrame on b with an envelope to fill: the frame
// object's own members read by validEnvelope.
func validAsFrame(b []byte) bool {
	var e envelope
	return validFrame(b, &e)
}

func TestValidMatchesEncodingJSON(t *testing.T) {
	for _, s := range append(validSeeds, envelopeSeeds...) {
		want := json.Valid([]byte(s))
		if got := valid([]byte(s)); got != want {
			t.Errorf("valid(%.60q) = %v, json.Valid says %v", s, got, want)
		}
		if got := validAsFrame([]byte(s)); got != want {
			t.Errorf("validFrame(%.60q) = %v, json.Valid says %v", s, got, want)
		}
	}
	// Every byte value at every position of a string long enough for the
	// word loops (two 32-byte blocks, an 8-byte word and a tail), both
	// without an escape (the searches for the closing quote and a
	// backslash, then the control bytes' loop) and after one (the
	// string's own loops).
	for _, prefix := range []string{``, `\n`} {
		for c := 0; c < 256; c++ {
			for pos := 0; pos < 75; pos++ {
				body := []byte(strings.Repeat("x", 75))
				body[pos] = byte(c)
				s := append(append([]byte(`"`+prefix), body...), '"')
				if got, want := valid(s), json.Valid(s); got != want {
					t.Errorf("prefix %q, byte %#x at %d: valid %v, json.Valid %v", prefix, c, pos, got, want)
				}
				// And as a key and a value of a frame object's own member.
				for _, f := range [][]byte{
					append(append([]byte(`{`), s...), `:1}`...),
					append(append([]byte(`{"id":`), s...), '}'),
				} {
					if got, want := validAsFrame(f), json.Valid(f); got != want {
						t.Errorf("prefix %q, byte %#x at %d in %q: validFrame %v, json.Valid %v", prefix, c, pos, f, got, want)
					}
				}
			}
		}
	}
}

// Strings of every length up to past shortString, as values and as keys,
// each with a special byte (or a plain one) at every position: where the
// word loop at a string's start finds its end, hands a special byte to
// the byte loop, or hands a long string to the vector searches.
func TestValidStringLengths(t *testing.T) {
	for n := 0; n <= shortString+20; n++ {
		for _, c := range []byte{'x', '"', '\\', 0x00, 0x1f, 0x7f, 0x80, 0xff} {
			for pos := 0; pos <= n; pos++ {
				body := []byte(strings.Repeat("y", n))
				if pos < n {
					body[pos] = c
				}
				for _, s := range [][]byte{
					append(append([]byte(`"`), body...), '"'),
					append(append([]byte(`{"`), body...), `":"v"}`...),
					append(append([]byte(`["`), body...), `\n", "`+string(body)+`"]`...),
				} {
					want := json.Valid(s)
					if got := valid(s); got != want {
						t.Fatalf("%q: valid %v, json.Valid %v", s, got, want)
					}
					if got := validAsFrame(s); got != want {
						t.Fatalf("%q: validFrame %v, json.Valid %v", s, got, want)
					}
				}
			}
		}
	}
}

// Long strings without an escape, as a chunk's base64 is, are tested for
// control bytes by a vector test for printable ASCII before hasControl:
// a control byte anywhere in them is refused, next to the vector loops'
// block boundaries and in their tails, whether the rest of the string is
// printable ASCII or not (DEL or a UTF-8 letter beside it, which only
// hasControl may then clear).
func TestValidLongStringControlBytes(t *testing.T) {
	for _, n := range []int{31, 32, 33, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097, 1<<20 + 3} {
		positions := map[int]bool{0: true, n / 2: true, n - 1: true}
		for _, k := range []int{16, 31, 32, 33, 63, 64, 65} {
			if n-k >= 0 {
				positions[n-k] = true
			}
		}
		for _, other := range []string{"", "\x7f", "\u00e9"} {
			for _, c := range []byte{0x00, 0x09, 0x1f, 0x20, 0x7e} {
				for pos := range positions {
					body := []byte(strings.Repeat("QUJD", n/4+1)[:n])
					body[pos] = c
					if other != "" {
						copy(body[(pos+n/3)%(n-2):], other)
						body[pos] = c
					}
					s := append(append([]byte(`{"data_b64":"`), body...), `"}`...)
					if got, want := valid(s), json.Valid(s); got != want {
						t.Errorf("length %d, byte %#x at %d, beside %q: valid %v, json.Valid %v", n, c, pos, other, got, want)
					}
					if c < 0x20 && valid(s) {
						t.Errorf("length %d, control byte %#x at %d, beside %q: accepted", n, c, pos, other)
					}
				}
			}
		}
	}
}

// FuzzValid holds valid to json.Valid on any input, and validFrame with
// an envelope (validEnvelope, for an object) too.
func FuzzValid(f *testing.F) {
	for _, s := range validSeeds {
		f.Add([]byte(s))
	}
	for _, s := range envelopeSeeds {
		f.Add([]byte(s))
	}
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := json.Valid(data)
		if got := valid(data); got != want {
			t.Fatalf("valid(%q) = %v, json.Valid says %v", data, got, want)
		}
		if got := validAsFrame(data); got != want {
			t.Fatalf("validFrame(%q) = %v, json.Valid says %v", data, got, want)
		}
	})
}

// BenchmarkValid compares valid with json.Valid on a chunk frame (1 MiB of
// data, base64) and on a small request.
func BenchmarkValid(b *testing.B) {
	chunk := []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"file/upload/chunk","params":{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":%q},"id":3}`,
		base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa5, 0x17, 0x3c}, 1<<20/3))))
	small := []byte(`{"jsonrpc":"2.0","method":"session/prompt","params":{"session_id":"sess-0123456789","prompt":"hello there"},"id":7}`)
	// A streamed chunk's session/update params as the gateway checks them
	// (EncodeRawNotification), once an update: short strings only.
	update := []byte(`{"session_id":"s-00000000000000000000000042","sessionId":"s-00000000000000000000000042","text":"1733529600123456789 ","turn_id":"turn_000000000000000000000000","type":"agent_message_chunk"}`)
	for _, c := range []struct {
		name  string
		frame []byte
	}{{"chunk", chunk}, {"small", small}, {"update", update}} {
		b.Run(c.name+"/valid", func(b *testing.B) {
			b.SetBytes(int64(len(c.frame)))
			for range b.N {
				if !valid(c.frame) {
					b.Fatal("invalid")
				}
			}
		})
		b.Run(c.name+"/json.Valid", func(b *testing.B) {
			b.SetBytes(int64(len(c.frame)))
			for range b.N {
				if !json.Valid(c.frame) {
					b.Fatal("invalid")
				}
			}
		})
	}
}

// BenchmarkClassify is the whole classification of a small request with a
// numeric id, the shape of every health or status call; and, as
// BenchmarkClassifyChunk, of an upload's chunk frame (1 MiB of data).
func BenchmarkClassify(b *testing.B) {
	frame := []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":12345}`)
	for range b.N {
		if m := Classify(frame); m.Kind != KindRequest {
			b.Fatal(m.Problem)
		}
	}
}

func BenchmarkClassifyChunk(b *testing.B) {
	frame := []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"file/upload/chunk","params":{"upload_id":"0123456789abcdef0123456789abcdef","offset":0,"data_b64":%q},"id":3}`,
		base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa5, 0x17, 0x3c}, 1<<20/3))))
	b.SetBytes(int64(len(frame)))
	for range b.N {
		if m := Classify(frame); m.Kind != KindRequest {
			b.Fatal(m.Problem)
		}
	}
}

// A request's classification allocates the request, its method and its
// frame's id text, not the id apart from its request: the two are one
// allocation (Request.id). Four allocations were three on every
// request's path.
func TestClassifyRequestAllocations(t *testing.T) {
	frame := []byte(`{"jsonrpc":"2.0","method":"health","params":{},"id":12345}`)
	n := testing.AllocsPerRun(100, func() {
		m := Classify(frame)
		if m.Kind != KindRequest || m.Request.ID == nil || m.Request.ID.String() != "12345" {
			t.Fatalf("classified %+v", m)
		}
	})
	if n > 3 {
		t.Fatalf("a request's classification allocates %v objects, want at most 3", n)
	}
}
