package jsonstr_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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
