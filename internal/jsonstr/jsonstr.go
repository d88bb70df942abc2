// Package jsonstr writes a Go string as a JSON string, byte for byte as
// encoding/json's Marshal writes it, without reflection or allocation.
// Hot paths that build JSON by hand use it: a session update's params,
// the gateway's frames, a Go plugin's tool result (which runs in a fresh
// WebAssembly instance, where encoding/json's first use is costly).
// AppendMinimal writes the escapes JSON requires alone, for text that
// only a JSON decoder reads (a memory plugin's answer).
package jsonstr

import (
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

// Len is the length of what Append writes for s. A string that needs no
// escape (most method names and ids) is measured without writing it.
func Len(s string) int {
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			return len(Append(nil, s))
		}
	}
	return len(s) + 2
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
// paid in fuel: runs that need no escape are found eight bytes at a time
// and copied whole (a memory plugin's answer of 1 MiB of plain text, 50
// units a byte through encoding/json, is 10.5).
func AppendMinimal(dst []byte, s string) []byte {
	if !utf8.ValidString(s) {
		return Append(dst, s)
	}
	dst = append(dst, '"')
	p := unsafe.Pointer(unsafe.StringData(s))
	start, i := 0, 0
	for {
		for i+8 <= len(s) && !escapeIn(*(*uint64)(unsafe.Add(p, i))) {
			i += 8
		}
		for i < len(s) && !mustEscape[s[i]] {
			i++
		}
		if i == len(s) {
			break
		}
		if start < i {
			dst = append(dst, s[start:i]...)
		}
		dst = appendEscaped(dst, s[i])
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

// escapeIn reports whether one of the eight bytes of w needs an escape: a
// byte below 0x20, a quote or a backslash (a byte b of w is zero in
// w^(b*ones), and a byte below n sets its high bit in (w-n*ones)&^w; a
// borrow only carries out of such a byte, so the test is exact).
func escapeIn(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, b := w^(ones*'"'), w^(ones*'\\')
	return ((w-ones*0x20)&^w|(q-ones)&^q|(b-ones)&^b)&highs != 0
}
