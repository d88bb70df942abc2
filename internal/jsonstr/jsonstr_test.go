package jsonstr_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
)

func sameAsEncodingJSON(t *testing.T, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := jsonstr.Append(nil, s); !bytes.Equal(got, want) {
		t.Fatalf("Append(%q)\n got %s\nwant %s", s, got, want)
	}
	if n := jsonstr.Len(s); n != len(want) {
		t.Fatalf("Len(%q) = %d, Append writes %d bytes", s, n, len(want))
	}
	// Fit, for every bound up to the whole (the first 64 of a long one):
	// its prefix is written in what it says, within the bound, and one
	// more character would pass it.
	for n := 0; n <= len(want)-2 && n < 64; n++ {
		p, w := jsonstr.Fit(s, n)
		if got := len(jsonstr.Append(nil, s[:p])) - 2; got != w || w > n {
			t.Fatalf("Fit(%q, %d) = %d, %d; Append writes %d bytes for the prefix", s, n, p, w, got)
		}
		if p < len(s) {
			_, size := utf8.DecodeRuneInString(s[p:])
			if len(jsonstr.Append(nil, s[:p+size]))-2 <= n {
				t.Fatalf("Fit(%q, %d) = %d: the next character fits too", s, n, p)
			}
		}
	}
	if p, w := jsonstr.Fit(s, len(want)-2); p != len(s) || w != len(want)-2 {
		t.Fatalf("Fit(%q, %d) = %d, %d: not the whole", s, len(want)-2, p, w)
	}
}

func TestAppendAsEncodingJSON(t *testing.T) {
	for _, s := range []string{
		"", "hello", `quote " backslash \ slash /`, "\b\f\n\r\t\x00\x01\x1f\x7f",
		"<script>&amp;</script>", "é ü 日本 🙂", "line\u2028para\u2029end",
		"bad \xff\xfe utf-8 \xc3", "cut rune \xe6\x97", "\xed\xa0\x80 surrogate",
		strings.Repeat("long plain text ", 100),
	} {
		sameAsEncodingJSON(t, s)
	}
	if got := string(jsonstr.Append([]byte("pre:"), "x")); got != `pre:"x"` {
		t.Fatalf("appended to a prefix: %s", got)
	}
}

func FuzzAppend(f *testing.F) {
	f.Add("hello")
	f.Add("<\x00\xff\u2028>\"\\")
	f.Fuzz(sameAsEncodingJSON)
}

// decodesAsEncodingJSON checks AppendMinimal(s): valid JSON that decodes
// to what encoding/json's own encoding of s decodes to (invalid UTF-8
// as U+FFFD), wherever the bytes to escape fall in its eight-byte words.
func decodesAsEncodingJSON(t *testing.T, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var w string
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	for pad := range 8 {
		p := strings.Repeat("p", pad)
		got := jsonstr.AppendMinimal([]byte("pre:"), p+s)
		var g string
		if !bytes.HasPrefix(got, []byte("pre:")) || !json.Valid(got[4:]) || json.Unmarshal(got[4:], &g) != nil || g != p+w {
			t.Fatalf("AppendMinimal(%q) = %q, decoding to %q; encoding/json's decodes to %q", p+s, got, g, p+w)
		}
	}
}

func TestAppendMinimal(t *testing.T) {
	for _, s := range []string{
		"", "hello", `quote " backslash \ slash /`, "\b\f\n\r\t\x00\x01\x1f\x7f",
		"<script>&amp;</script>", "é ü 日本 🙂", "line\u2028para\u2029end",
		"bad \xff\xfe utf-8 \xc3", "cut rune \xe6\x97", "\xed\xa0\x80 surrogate",
		strings.Repeat("long plain text ", 100), strings.Repeat("\x01a", 20), "0123456\"89abcdef\x1f",
	} {
		decodesAsEncodingJSON(t, s)
	}
	// Only what JSON requires is escaped.
	for s, want := range map[string]string{
		"a<b>&c\u2028d": "\"a<b>&c\u2028d\"",
		"x\"y\\z\n\x01": `"x\"y\\z\n\u0001"`,
	} {
		if got := string(jsonstr.AppendMinimal(nil, s)); got != want {
			t.Errorf("AppendMinimal(%q) = %s, want %s", s, got, want)
		}
	}
}

// AppendMinimal finds the next byte to escape from a word's lowest set
// bit, where a borrow out of a byte to escape may set the bits of the
// bytes after it (0x01 then 0x20, say). Every pair of ASCII bytes, at
// every offset in two words, is written exactly as a byte loop writes it.
func TestAppendMinimalEveryPairEveryOffset(t *testing.T) {
	byByte := func(s []byte) string {
		out := []byte{'"'}
		for _, c := range s {
			switch {
			case c == '"' || c == '\\':
				out = append(out, '\\', c)
			case c < 0x20:
				e := jsonstr.Append(nil, string(c)) // "\n", "\u0001"
				out = append(out, e[1:len(e)-1]...)
			default:
				out = append(out, c)
			}
		}
		return string(append(out, '"'))
	}
	s := []byte(strings.Repeat("p", 17))
	var buf []byte
	for off := range 16 {
		for a := range 128 {
			for b := range 128 {
				s[off], s[off+1] = byte(a), byte(b)
				buf = jsonstr.AppendMinimal(buf[:0], string(s))
				if want := byByte(s); string(buf) != want {
					t.Fatalf("AppendMinimal(%q) = %s, want %s", s, buf, want)
				}
			}
		}
		s[off] = 'p'
	}
}

func FuzzAppendMinimal(f *testing.F) {
	f.Add("hello")
	f.Add("<\x00\xff\u2028>\"\\")
	f.Add("01234567\x1f9abcdef\"")
	f.Fuzz(decodesAsEncodingJSON)
}

func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct{ name, s string }{
		{"ascii", "The quick brown fox jumps over the lazy dog, 1234567890."},
		{"escapes", "Line one\nLine two: \"quoted\" <b>bold</b> & café 🙂\n"},
	} {
		b.Run(c.name+"/jsonstr", func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 256)
			for b.Loop() {
				buf = jsonstr.Append(buf[:0], c.s)
			}
		})
		// Fit measures each chunk a provider streams (the reply bound).
		b.Run(c.name+"/fit", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if p, _ := jsonstr.Fit(c.s, 1<<22); p != len(c.s) {
					b.Fatal(p)
				}
			}
		})
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := json.Marshal(c.s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
