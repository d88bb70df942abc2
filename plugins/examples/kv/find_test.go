package main

import (
	"strings"
	"testing"
)

// finder answers as strings.Contains does, on both of its ways: the
// compares (short inputs) and Rabin-Karp (inputs whose compares pass
// their budget).
func TestFinderAgreesWithContains(t *testing.T) {
	period := "abcccccccccccccc"
	cases := []struct{ s, q string }{
		{"", ""}, {"a", ""}, {"", "a"}, {"a", "a"}, {"ab", "b"}, {"ab", "ba"}, {"abc", "abc"}, {"abc", "abcd"},
		{strings.Repeat("a", 1000), strings.Repeat("a", 50) + "b"},
		{strings.Repeat("a", 1000) + "b", strings.Repeat("a", 50) + "b"},
		{"b" + strings.Repeat("a", 1000), "b" + strings.Repeat("a", 999)},
		{strings.Repeat(period, 200), strings.Repeat(period, 12) + "x"},
		{strings.Repeat(period, 200) + "x", strings.Repeat(period, 12) + "x"},
		{strings.Repeat(period, 200), strings.Repeat(period, 12)},
		{strings.Repeat("ab", 500) + "abx" + strings.Repeat("ab", 500), "ababx"},
		{strings.Repeat("ab", 500), "ba"},
	}
	for _, c := range cases {
		if got, want := newFinder(c.q).in(c.s), strings.Contains(c.s, c.q); got != want {
			t.Errorf("%.20q in %.20q (%d bytes): %v, Contains %v", c.q, c.s, len(c.s), got, want)
		}
	}
}

func FuzzFinder(f *testing.F) {
	f.Add("abcabcabd", "abd")
	f.Add(strings.Repeat("ab", 200)+"x", "abababx")
	f.Fuzz(func(t *testing.T, s, q string) {
		// Repeated, so that the compares' budget runs out and the rest
		// goes to Rabin-Karp.
		s = strings.Repeat(s, 1+200/(len(s)+1))
		if got, want := newFinder(q).in(s), strings.Contains(s, q); got != want {
			t.Fatalf("%q in %q: %v, Contains %v", q, s, got, want)
		}
	})
}
