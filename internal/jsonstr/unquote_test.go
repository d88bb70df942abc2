package jsonstr

import (
	"encoding/json"
	"strings"
	"testing"
)

// checkUnquote holds Unquote to encoding/json: a literal it reads decodes
// to the same string there, and what follows it is left; one it refuses
// may be anything.
func checkUnquote(t *testing.T, b []byte) {
	s, rest, ok := Unquote(b)
	if !ok {
		if len(rest) != len(b) {
			t.Fatalf("%q refused, with %d bytes consumed", b, len(b)-len(rest))
		}
		return
	}
	lit := b[:len(b)-len(rest)]
	var want string
	if err := json.Unmarshal(lit, &want); err != nil {
		t.Fatalf("%q read as %q, encoding/json refuses %q: %v", b, s, lit, err)
	}
	if s != want {
		t.Fatalf("%q read as %q, encoding/json %q", lit, s, want)
	}
}

var unquoteCases = []string{
	`""`, `"a"`, `"plain text, a little longer than a word"`, `"é日本語"`, `"a\"b"`, `"\\"`, `"\/\b\f\n\r\t"`,
	`"\u0001\u001f\u00e9\u65e5"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00\ud83d"`, `"\ud83dx"`, `"\ud83d\u0041"`,
	`"\ud83d\ud83d\ude00"`, `"a" rest`, `"a","b"`, `"\u00"`, `"\uZZZZ"`, `"\x"`, `"\`, `"abc`, `"a` + "\x01" + `"`,
	"\"\xff\"", "\"\xc3\"", "\"\xc3\\u00e9\"", "\"\\u00e9\xa9\"", "\"\xed\xa0\x80\"", `"\u2028 <&>"`, `x`, ``, `"`,
	`"\u"`, `"aaaaaa\n\u\u"`, `"\u\u\u\u"`, `"a\u12"`, `"\u12\n"`, `"ab\ud83d\u"`,
	`"` + strings.Repeat("eight by", 3) + `\n"`, `"` + strings.Repeat("\\u0001", 40) + `"`,
}

func TestUnquote(t *testing.T) {
	for _, c := range unquoteCases {
		checkUnquote(t, []byte(c))
	}
	// Every byte at every offset of a word: escapeMask's borrows.
	for off := range 9 {
		for c := range 256 {
			b := []byte(`"` + strings.Repeat("a", off) + string(rune(0)) + strings.Repeat("b", 9) + `"`)
			b[1+off] = byte(c)
			checkUnquote(t, b)
		}
	}
	s, rest, ok := Unquote([]byte(`"a\nb" , "c"`))
	if !ok || s != "a\nb" || string(rest) != ` , "c"` {
		t.Fatalf("read %q, left %q, %v", s, rest, ok)
	}
}

func FuzzUnquote(f *testing.F) {
	for _, c := range unquoteCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkUnquote)
}

// BenchmarkUnquote reads 1 MiB of text written by AppendMinimal, against
// encoding/json's Unmarshal of the same literal.
func BenchmarkUnquote(b *testing.B) {
	for _, c := range []struct{ name, period string }{
		{"plain", "the quick brown fox jumps over the lazy dog "},
		{"lines", "a line of a log\n"},
		{"accented", "Élan vital à Paris "},
		{"control", "\x01"},
	} {
		text := strings.Repeat(c.period, (1<<20)/len(c.period))
		lit := AppendMinimal(nil, text)
		b.Run(c.name+"/Unquote", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if s, _, ok := Unquote(lit); !ok || len(s) != len(text) {
					b.Fatal("not read")
				}
			}
		})
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				var s string
				if err := json.Unmarshal(lit, &s); err != nil || len(s) != len(text) {
					b.Fatal(err)
				}
			}
		})
	}
}
