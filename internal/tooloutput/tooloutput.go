// Package tooloutput is the one bound on a tool call's output as it is
// kept: the session's transcript, its tool call rows and the provider's
// context hold at most MaxKeptBytes of it, and a durable pane shows the
// same, whether it followed the call live or was rebuilt from what the
// session stored.
package tooloutput

import (
	"fmt"
	"unicode/utf8"
)

// MaxKeptBytes caps a tool call's output as it is kept.
const MaxKeptBytes = 16 << 10

// Kept is out cut to MaxKeptBytes, at a character boundary, with a note
// that says so where it was cut.
func Kept(out string) string { return KeptOf(out, len(out)) }

// KeptOf is Kept of an output of total bytes of which out is the start
// (a live update carries a longer output cut at its own bound): the same
// bytes and the same note as Kept of the whole output.
func KeptOf(out string, total int) string {
	total = max(total, len(out))
	if total <= MaxKeptBytes {
		return out
	}
	cut := Start(out, MaxKeptBytes)
	return cut + fmt.Sprintf("\n[tool output truncated: %d of %d bytes kept]", len(cut), total)
}

// Start is the start of out of at most n bytes, cut at a character
// boundary (the plugin sandbox sends a tool's output cut so, to the
// bytes its caller shows).
func Start(out string, n int) string {
	cut := min(max(n, 0), len(out))
	for cut > 0 && cut < len(out) && !utf8.RuneStart(out[cut]) {
		cut--
	}
	return out[:cut]
}
