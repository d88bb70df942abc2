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

// The stretches caseless names have no rune with a lower case of its
// own in this Go's Unicode tables.
func TestCaselessRanges(t *testing.T) {
	for r := rune(0x800); r <= unicode.MaxRune; r++ {
		if caseless(r) && unicode.ToLower(r) != r {
			t.Fatalf("%U is in a caseless stretch but lowers to %U", r, unicode.ToLower(r))
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
