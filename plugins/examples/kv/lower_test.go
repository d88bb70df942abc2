package main

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// lower answers as strings.ToLower does: every rune alone, after ASCII
// and after a rune of each width, and text that is not UTF-8.
func TestLowerAgreesWithToLower(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		for _, s := range []string{string(r), "Ab" + string(r) + "Ω", "É" + string(r) + "日", string(r) + "İÀ\u212aɐ😀Z\xff"} {
			if got, want := lower(s), strings.ToLower(s); got != want {
				t.Fatalf("%U in %q: %q, ToLower %q", r, s, got, want)
			}
		}
	}
	for _, s := range []string{"\xff", "A\xffÉ", "É\xc3", "\xc3\x28", "\xe2\x82", "Ⱥ" + strings.Repeat("Ä", 10), "İSTANBUL", "\u212a", "İ\xffA", "aİbȺcK😀dÉ"} {
		if got, want := lower(s), strings.ToLower(s); got != want {
			t.Fatalf("%q: %q, ToLower %q", s, got, want)
		}
	}
}

// What caseless names has no rune with a lower case of its own in this
// Go's Unicode tables, and every block of 256 without one is named.
func TestCaselessRanges(t *testing.T) {
	for r := rune(0x800); r <= unicode.MaxRune; r++ {
		if caseless(r) && unicode.ToLower(r) != r {
			t.Fatalf("%U is in a caseless stretch but lowers to %U", r, unicode.ToLower(r))
		}
	}
	for k := rune(8); k < 256; k++ {
		none := true
		for r := k << 8; r < (k+1)<<8; r++ {
			none = none && unicode.ToLower(r) == r
		}
		if none && !caseless(k<<8) {
			t.Errorf("U+%04X to U+%04X has no lower case, not marked", k<<8, k<<8+255)
		}
	}
}

func FuzzLower(f *testing.F) {
	f.Add("Élan ÄÖÜ Ωμέγα ПРИВЕТ 日本語 Ⱥ İ \xff")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := lower(s), strings.ToLower(s); got != want {
			t.Fatalf("%q: %q, ToLower %q", s, got, want)
		}
	})
}
