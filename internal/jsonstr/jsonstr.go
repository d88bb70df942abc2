// Package jsonstr writes a Go string as a JSON string, byte for byte as
// encoding/json's Marshal writes it, without reflection or allocation.
// Hot paths that build JSON by hand use it: a session update's params,
// the gateway's frames, a Go plugin's tool result (which runs in a fresh
// WebAssembly instance, where encoding/json's first use is costly).
// AppendMinimal writes the escapes JSON requires alone, for text that
// only a JSON decoder reads (a memory plugin's answer).
package jsonstr

import (
	"math"
	"math/bits"
	"unicode/utf8"
	"unsafe"
)

const hexDigits = "0123456789abcdef"

// Append appends s to dst as a JSON string with encoding/json's escapes:
// quote and backslash; control characters (\b \f \n \r \t by name, the
// rest as \u00XX); <, > and & as \u00XX, which keeps the text inert
// inside HTML; U+2028 and U+2029, which end a line in JavaScript; and
// each byte of invalid UTF-8 as \ufffd, the replacement character.
func Append(dst []byte, s string) []byte {
	dst = append(dst, '"')
	// Most strings (ids, keys, plain text) need no escape: found in one
	// tight pass and copied whole.
	i := 0
	for i < len(s) && plain(s[i]) {
		i++
	}
	start := 0
	for i < len(s) {
		b := s[i]
		if b < utf8.RuneSelf {
			if plain(b) {
				i++
				continue
			}
			dst = appendEscaped(append(dst, s[start:i]...), b)
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendEscaped appends the escape of the ASCII byte b: by name where
// JSON has one (quote, backslash, \b \f \n \r \t), else \u00XX.
func appendEscaped(dst []byte, b byte) []byte {
	switch b {
	case '"', '\\':
		return append(dst, '\\', b)
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
}

// Len is the length of what Append writes for s, measured without
// writing it (it wrote a string that needed an escape to measure it: a
// copy of 6 MiB, grown twenty times, for 1 MiB of control characters).
func Len(s string) int {
	_, w := Fit(s, math.MaxInt)
	return w + 2
}

// plain reports whether encoding/json writes the byte b as it is: ASCII
// that is neither a control character, a quote, a backslash nor one of
// the HTML characters < > &.
func plain(b byte) bool {
	return b >= 0x20 && b < utf8.RuneSelf && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
}

// Fit returns the length of the longest prefix of s, ending at a character
// boundary, that Append writes in at most n bytes between its quotes, and
// how many bytes it writes for it. It measures without writing, for a
// bound on text as its JSON (a turn's reply in its turn_complete).
func Fit(s string, n int) (prefix, written int) {
	// Plain text, the most of it, in one tight pass.
	i := 0
	for i < len(s) && i < n && plain(s[i]) {
		i++
	}
	w := i
	for i < len(s) {
		size, out := 1, 1
		if b := s[i]; b < utf8.RuneSelf {
			switch {
			case plain(b):
			case b == '"' || b == '\\' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t':
				out = 2
			default:
				out = 6
			}
		} else {
			var c rune
			c, size = utf8.DecodeRuneInString(s[i:])
			out = size
			if (c == utf8.RuneError && size == 1) || c == '\u2028' || c == '\u2029' {
				out = 6
			}
		}
		if w+out > n {
			break
		}
		i, w = i+size, w+out
	}
	return i, w
}

// AppendMinimal appends s to dst as a JSON string with only the escapes
// JSON requires: quote, backslash and control characters (\b \f \n \r
// \t by name, the rest as \u00XX). <, > and &, U+2028 and U+2029 are written as
// they are. A string that is not valid UTF-8 is written by Append, each
// bad byte as \ufffd. It decodes to what Append's output decodes to.
//
// It is for Go compiled to WebAssembly, where every byte a loop visits is
// paid in fuel: the next byte to escape is found eight bytes at a time
// (escapeMask), the run before it copied whole, and its escape written by
// one store of a word from a table (a memory plugin's answer of 1 MiB of
// plain text, 50 units a byte through encoding/json, is 10.5; of control
// characters 263, then 209).
func AppendMinimal(dst []byte, s string) []byte {
	if !utf8.ValidString(s) {
		return Append(dst, s)
	}
	dst = append(dst, '"')
	p := unsafe.Pointer(unsafe.StringData(s))
	start, i := 0, 0
	for {
		found := false
		for i+8 <= len(s) {
			w := *(*uint64)(unsafe.Add(p, i))
			if !littleEndian {
				w = bits.ReverseBytes64(w)
			}
			if m := escapeMask(w); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				found = true
				break
			}
			i += 8
		}
		if !found {
			for i < len(s) && !mustEscape[s[i]] {
				i++
			}
			if i == len(s) {
				break
			}
		}
		if start < i {
			dst = append(dst, s[start:i]...)
		}
		dst = appendEscapeWord(dst, s[i])
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// mustEscape marks the bytes JSON requires escaped (a table: on wasm,
// one load costs less than the three comparisons).
var mustEscape = func() (t [256]bool) {
	for b := range 0x20 {
		t[b] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// escapeMask finds a byte that needs an escape in the eight bytes of w,
// the first in memory its lowest: a byte below 0x20, a quote or a
// backslash (a byte b of w is zero in w^(b*ones), and a byte below n sets
// its high bit in (w-n*ones)&^w). Its lowest set bit is the high bit of
// the lowest such byte; a borrow only carries out of such a byte, so the
// bits above it may be set by the borrow and are not to be read.
func escapeMask(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, b := w^(ones*'"'), w^(ones*'\\')
	return ((w-ones*0x20)&^w | (q-ones)&^q | (b-ones)&^b) & highs
}

// escapeWords holds, for each byte JSON requires escaped, its escape
// (appendEscaped's) in the low bytes, the first lowest, and its length in
// the top byte.
var escapeWords = func() (t [256]uint64) {
	for b := range t {
		if !mustEscape[b] {
			continue
		}
		e := appendEscaped(nil, byte(b))
		for k, c := range e {
			t[b] |= uint64(c) << (8 * k)
		}
		t[b] |= uint64(len(e)) << 56
	}
	return t
}()

// appendEscapeWord appends the escape of b, which must need one, by one
// store of its word: on wasm the store costs less than appendEscaped's
// cases and its appends of two to six bytes.
func appendEscapeWord(dst []byte, b byte) []byte {
	w := escapeWords[b]
	n := len(dst)
	if cap(dst)-n < 8 {
		dst = append(dst[:cap(dst)], make([]byte, 8)...)
	}
	e := w &^ (0xff << 56)
	if !littleEndian {
		e = bits.ReverseBytes64(e)
	}
	*(*uint64)(unsafe.Pointer(unsafe.SliceData(dst[n : n+8]))) = e
	return dst[:n+int(w>>56)]
}
