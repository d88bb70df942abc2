// Package jsonwalk steps through JSON text that has already been checked
// (by the gateway's validator, or json.Compact): the end of a string or
// a value, the members of an object, without decoding anything. The
// gateway reads frames with it; the plugin host splits a tool call's
// arguments with it.
package jsonwalk

import "bytes"

// NextMember walks the members of a JSON object that is known to be valid.
// i is the index just past '{' or past the previous member. key is the raw
// key with its quotes; val the raw value.
func NextMember(b []byte, i int) (key, val []byte, next int, ok bool) {
	i = SkipSpace(b, i)
	if i < len(b) && b[i] == ',' {
		i = SkipSpace(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		return nil, nil, i, false
	}
	ke := SkipString(b, i)
	key = b[i:ke]
	i = SkipSpace(b, ke)
	i = SkipSpace(b, i+1) // ':'
	ve := SkipValue(b, i)
	return key, b[i:ve], ve, true
}

// SkipSpace returns the index of the first byte at or after i that is
// not JSON white space (len(b) if none); any input will do.
func SkipSpace(b []byte, i int) int {
	// JSON's four white-space bytes are none above ' ', and the byte
	// after a frame's key, colon or value is nearly never white space:
	// one comparison tells it, not IsSpace's four.
	for i < len(b) && b[i] <= ' ' && IsSpace(b[i]) {
		i++
	}
	return i
}

// IsSpace reports whether c is JSON white space.
func IsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// SkipString returns the index just past the string starting at b[i]=='"'
// (len(b) when it does not end).
// It searches for quotes and backslashes with bytes.IndexByte (a chunk's
// string is 1.4 MB): each byte is searched at most once for each, however
// many escapes the string holds.
func SkipString(b []byte, i int) int {
	i++
	q := -1 // the next quote at or after i, once known
	for {
		if q < i {
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				return len(b)
			}
			q = i + j
		}
		e := bytes.IndexByte(b[i:q], '\\')
		if e < 0 {
			return q + 1
		}
		i += e + 2 // past the escape and the character it escapes
	}
}

// SkipValue returns the index just past the valid JSON value at b[i].
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = SkipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
		i++
	}
	return i
}
