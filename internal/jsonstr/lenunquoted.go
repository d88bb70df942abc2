package jsonstr

import "unicode/utf8"

// LenUnquoted is Len of the string the JSON literal at the start of b
// decodes to (what UnquoteStart reads whole), measured without decoding
// it; -1 for a literal UnquoteStart refuses. FuzzLenUnquoted holds it to
// Len of encoding/json's decoding.
//
// The plugin sandbox builds a recall's answer from the entries a memory
// plugin answers, each string written again with Append, and says how
// long the whole answer is: the entries past what the caller is shown are
// only measured, here, so that an answer of up to 16 MiB is never
// decoded whole to be cut to 1 MiB.
func LenUnquoted(b []byte) int {
	end, _ := literalEnd(b)
	if end < 0 {
		return -1
	}
	lit := b[1:end]
	w := 2
	for i := 0; i < len(lit); {
		c := lit[i]
		switch {
		case plain(c):
			// Plain text, the most of it, in one tight pass.
			j := i + 1
			for j < len(lit) && plain(lit[j]) {
				j++
			}
			w += j - i
			i = j
		case c == '\\':
			r, used := escape(lit[i:])
			if used == 0 {
				return -1
			}
			i += used
			w += runeJSONLen(r)
		case c < utf8.RuneSelf:
			// <, > or & (literalEnd refused control characters; quotes
			// and backslashes are escapes).
			w += 6
			i++
		default:
			// A bad byte decodes to U+FFFD, which Append writes as it is.
			r, size := utf8.DecodeRune(lit[i:])
			w += runeJSONLen(r)
			i += size
		}
	}
	return w
}

// runeJSONLen is how many bytes Append writes for the rune r, which is
// valid (a surrogate was decoded to U+FFFD).
func runeJSONLen(r rune) int {
	switch {
	case r < utf8.RuneSelf && plain(byte(r)):
		return 1
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < utf8.RuneSelf, r == '\u2028', r == '\u2029':
		return 6
	}
	return utf8.RuneLen(r)
}
