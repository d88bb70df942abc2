package memory

import (
	"bytes"
	"errors"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

var (
	errNotString = errors.New("not a string")
	errEscape    = errors.New("malformed escape in string")
)

// unquote decodes the JSON string literal q, its quotes included, as
// encoding/json does (a surrogate escape without its pair becomes U+FFFD),
// in q's own memory; without escapes the string returned is made over q,
// so q must not be used again.
//
// fastjson's own unescaping spent about 1,200 units of the plugin's fuel
// an escape (1 MiB of control characters ran out of a call's fuel).
// Here a run without escapes is found with the runtime's IndexByte and
// moved whole, and an escape costs a few comparisons and two table reads.
func unquote(q []byte) (string, error) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", errNotString
	}
	s := q[1 : len(q)-1]
	i := bytes.IndexByte(s, '\\')
	if i < 0 {
		return unsafe.String(unsafe.SliceData(s), len(s)), nil
	}
	// No escape decodes to more bytes than it is written in, so what is
	// decoded never overtakes what is read.
	w := i
	for i < len(s) {
		if s[i] != '\\' {
			// Runs between escapes are often short: a few bytes are
			// moved one by one before IndexByte (a call) looks further
			// (four: the fewest units over quoted HTML, Go source, JSON).
			for end := min(i+4, len(s)); i < end && s[i] != '\\'; i++ {
				s[w] = s[i]
				w++
			}
			if i == len(s) || s[i] == '\\' {
				continue
			}
			j := bytes.IndexByte(s[i:], '\\')
			if j < 0 {
				j = len(s) - i
			}
			w += copy(s[w:], s[i:i+j])
			i += j
			continue
		}
		if i+1 == len(s) {
			return "", errEscape
		}
		if c := shortEscape[s[i+1]]; c != 0 {
			s[w] = c
			w++
			i += 2
			continue
		}
		r := hex4(s[i:])
		if r < 0 {
			return "", errEscape
		}
		i += 6
		if r < utf8.RuneSelf {
			s[w] = byte(r)
			w++
			continue
		}
		if utf16.IsSurrogate(r) {
			if d := utf16.DecodeRune(r, hex4(s[i:])); d != utf8.RuneError {
				r = d
				i += 6
			} else {
				r = utf8.RuneError
			}
		}
		w += utf8.EncodeRune(s[w:], r)
	}
	// A copy: the string may be kept for long (kv keeps every entry), and
	// over q it would hold all of q, up to six times its own length.
	return string(s[:w]), nil
}

// hex4 decodes the escape \uXXXX at the start of s, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	a, b, c, d := hexDigit[s[2]], hexDigit[s[3]], hexDigit[s[4]], hexDigit[s[5]]
	if a|b|c|d < 0 {
		return -1
	}
	return rune(a)<<12 | rune(b)<<8 | rune(c)<<4 | rune(d)
}

// Tables, not switches: each branch a Go function takes costs a trip
// through its dispatch loop in wasm, and fuel with it.
var (
	shortEscape [256]byte // the byte \c stands for; 0 for u and the invalid
	hexDigit    [256]int8 // a hex digit's value; -1 for the rest
)

func init() {
	for c, v := range map[byte]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'} {
		shortEscape[c] = v
	}
	for c := range hexDigit {
		switch {
		case '0' <= c && c <= '9':
			hexDigit[c] = int8(c - '0')
		case 'a' <= c && c <= 'f':
			hexDigit[c] = int8(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			hexDigit[c] = int8(c - 'A' + 10)
		default:
			hexDigit[c] = -1
		}
	}
}
