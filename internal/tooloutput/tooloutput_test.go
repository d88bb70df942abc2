package tooloutput

import (
	"strings"
	"testing"
)

// KeptOf of a live output (the whole one, or its start cut at the live
// bound) gives the bytes and the note Kept gives of the whole output.
func TestKeptOfAgreesWithKept(t *testing.T) {
	whole := strings.Repeat("\u00e9a", 20000) // a character across the cut
	for _, live := range []string{whole, whole[:40000], whole[:MaxKeptBytes+1]} {
		if got, want := KeptOf(live, len(whole)), Kept(whole); got != want {
			t.Errorf("KeptOf of %d of %d bytes: %.40q…, want %.40q…", len(live), len(whole), got[len(got)-60:], want[len(want)-60:])
		}
	}
	if got := Kept("short"); got != "short" {
		t.Errorf("Kept(short) = %q", got)
	}
	got := Kept(whole)
	if !strings.HasSuffix(got, "\n[tool output truncated: 16383 of 60000 bytes kept]") {
		t.Errorf("note: %q", got[len(got)-60:])
	}
}
