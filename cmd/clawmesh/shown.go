package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// shown is s as the command prints it: control characters (C0, DEL, C1),
// the controls that reorder text (bidirectional embeddings, overrides and
// isolates) and bytes that are not UTF-8 escaped as Go writes them ("\x1b",
// "\n", "\u202e"), the rest as it is. Text from a registry index, a
// plugin's manifest or skill files or the stack's answers is not the
// command's own: printed raw, an index entry's description set the
// terminal's title, cleared it, and wrote a line that read like the
// command's own "signature: trusted".
func shown(s string) string {
	clean := true
	for i := 0; i < len(s) && clean; {
		r, n := utf8.DecodeRuneInString(s[i:])
		clean = !escaped(r, n)
		i += n
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case escaped(r, n):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// shownAny is shown of a value's default format.
func shownAny(v any) string { return shown(fmt.Sprint(v)) }

func escaped(r rune, n int) bool {
	switch {
	case r == utf8.RuneError && n == 1:
		return true
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}
