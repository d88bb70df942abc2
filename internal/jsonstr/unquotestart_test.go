package jsonstr

import (
	"encoding/json"
	"strings"
	"testing"
)

// checkUnquoteStart holds UnquoteStart to encoding/json at the cut n: a
// literal it reads decodes there to a string whose first n bytes it kept
// and whose length it gave, with what follows the literal left; it
// refuses nothing encoding/json reads as a string.
func checkUnquoteStart(t *testing.T, b []byte, n int) {
	t.Helper()
	start, total, rest, ok := UnquoteStart(b, n)
	if !ok {
		var s string
		if len(rest) != len(b) {
			t.Fatalf("%q refused at %d, with %d bytes consumed", b, n, len(b)-len(rest))
		}
		// A literal starts at b[0]: encoding/json's Unmarshal also
		// skips white space before it, which the reader is not asked to.
		if len(b) > 0 && b[0] == '"' && json.Unmarshal(b, &s) == nil {
			t.Fatalf("%q refused at %d; encoding/json reads it as %q", b, n, s)
		}
		return
	}
	lit := b[:len(b)-len(rest)]
	var want string
	if err := json.Unmarshal(lit, &want); err != nil {
		t.Fatalf("%q read at %d as %q, encoding/json refuses %q: %v", b, n, start, lit, err)
	}
	if keep := want[:min(max(n, 0), len(want))]; start != keep || total != len(want) {
		t.Fatalf("%q at %d: kept %q of %d bytes; encoding/json %q of %d", lit, n, start, total, keep, len(want))
	}
}

// cutCases put a character, an escape, a surrogate pair and a bad byte
// across every cut from 0 to 8, and something encoding/json refuses
// after the cut.
var cutCases = []string{
	`"aé日🙂"`, `"a\u00e9\u65e5\ud83d\ude00"`, `"ab\n\"\\\/c"`, "\"a\xffb\xc3\"", "\"\xed\xa0\x80x\"",
	`"ab\ud83dx"`, `"\ud83d\u0041"`, `"abcdefgh\u00"`, `"abcdefgh\x"`, `"abcdefgh`, `"abcdefgh` + "\x01" + `"`,
	"\"abcdefgh\xff", `"abcdefgh\`, `"abc\"def" rest`, `"\ufffd"`, "\"\xef\xbf\xbd\"",
}

func TestUnquoteStart(t *testing.T) {
	for _, c := range append(append([]string(nil), unquoteCases...), cutCases...) {
		for n := -1; n <= len(c)+1; n++ {
			checkUnquoteStart(t, []byte(c), n)
		}
	}
	// An escape or a bad byte far past the cut is still read or refused
	// as a whole literal: only the writing stops at the cut.
	long := strings.Repeat("x", 1000)
	for _, c := range []string{`"` + long + `\u12"`, `"` + long + "\x02\"", `"` + long + `\ud83d\ude00` + "\xff\"", `"` + long} {
		checkUnquoteStart(t, []byte(c), 10)
	}
	s, total, rest, ok := UnquoteStart([]byte(`"a\u00e9b" , "c"`), 2)
	if !ok || s != "a\xc3" || total != 4 || string(rest) != ` , "c"` {
		t.Fatalf("read %q of %d, left %q, %v", s, total, rest, ok)
	}
}

func FuzzUnquoteStart(f *testing.F) {
	for _, c := range append(append([]string(nil), unquoteCases...), cutCases...) {
		f.Add([]byte(c), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, n uint8) { checkUnquoteStart(t, b, int(n)) })
}

// BenchmarkUnquoteStart reads a 16 MiB literal keeping its first MiB, as
// the sandbox reads a tool's output for a session; B/op is what is kept.
func BenchmarkUnquoteStart(b *testing.B) {
	for _, c := range []struct{ name, period string }{
		{"plain", "the quick brown fox jumps over the lazy dog "},
		{"lines", "a line of a log\n"},
		{"accented", "Élan vital à Paris "},
	} {
		text := strings.Repeat(c.period, (16<<20-64)/len(Append(nil, c.period)))
		lit := Append(nil, text)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(lit)))
			for b.Loop() {
				if s, total, _, ok := UnquoteStart(lit, 1<<20+1); !ok || len(s) != 1<<20+1 || total != len(text) {
					b.Fatal("not read")
				}
			}
		})
	}
}

// checkLenUnquoted holds LenUnquoted to Len of what encoding/json decodes
// the literal at the start of b to, and to UnquoteStart's refusals.
func checkLenUnquoted(t *testing.T, b []byte) {
	t.Helper()
	got := LenUnquoted(b)
	_, _, rest, ok := UnquoteStart(b, 0)
	if !ok {
		if got != -1 {
			t.Fatalf("%q refused by UnquoteStart, measured %d", b, got)
		}
		return
	}
	var s string
	if err := json.Unmarshal(b[:len(b)-len(rest)], &s); err != nil {
		t.Fatalf("%q: encoding/json refuses it: %v", b, err)
	}
	if want := Len(s); got != want {
		t.Fatalf("%q measured %d; Len of encoding/json's %q is %d", b, got, s, want)
	}
}

var lenCases = []string{
	`"<a&b>"`, `"\u003c\u003e\u0026"`, "\"\u2028\u2029\"", `"\u2028\u2029"`, `"\u0000\u001f\u007f"`,
	`"\b\f\n\r\t\/"`, "\"\x7f\"", `"\ud800\udc00\udbff"`,
}

func TestLenUnquoted(t *testing.T) {
	for _, c := range append(append(append([]string(nil), unquoteCases...), cutCases...), lenCases...) {
		checkLenUnquoted(t, []byte(c))
	}
}

func FuzzLenUnquoted(f *testing.F) {
	for _, c := range append(append(append([]string(nil), unquoteCases...), cutCases...), lenCases...) {
		f.Add([]byte(c))
	}
	f.Fuzz(checkLenUnquoted)
}
