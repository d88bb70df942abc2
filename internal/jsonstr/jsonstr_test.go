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
