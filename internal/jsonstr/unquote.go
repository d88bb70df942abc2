package jsonstr

import (
	"bytes"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// Unquote reads the JSON string literal at the start of b and returns
// what encoding/json's Unmarshal decodes it to, and the bytes after it.
// ok is false for a literal it does not read (invalid UTF-8, a control
// character, a malformed escape, no closing quote) and for anything not
// starting with a quote: the caller then leaves b to encoding/json, which
// says what is wrong or replaces what it replaces. FuzzUnquote holds the
// two together.
//
// It is the host's reading of what AppendMinimal writes (a memory
// plugin's answer): encoding/json scans and decodes a string at about 200
// MB/s; here the next quote, backslash or control character is found
// eight bytes at a time (escapeMask) and the run before it copied whole.
// The guest library decodes a store's strings with its own unquote
// (plugins/pdk/memory): in place, after fastjson found the literal, and
// tuned to what each byte costs in fuel under the meter, where the
// calls a shared one would add are paid for at every escape.
func Unquote(b []byte) (s string, rest []byte, ok bool) {
	end, saved := literalEnd(b)
	if end < 0 {
		return "", b, false
	}
	lit := b[1:end]
	if saved == 0 {
		if !utf8.Valid(lit) {
			return "", b, false
		}
		return string(lit), b[end+1:], true
	}
	// Sized to what the escapes save at least: memory touched the first
	// time is dear on this machine (a page fault each 4 KiB), and six
	// bytes of \u00XX decode to one.
	out := make([]byte, len(lit)-saved)
	w, i := 0, 0
	for i < len(lit) {
		if lit[i] != '\\' {
			j := bytes.IndexByte(lit[i:], '\\')
			if j < 0 {
				w += copy(out[w:], lit[i:])
				break
			}
			w += copy(out[w:], lit[i:i+j])
			i += j
		}
		if e := shortEscapes[lit[i+1]]; e != 0 {
			out[w] = e
			w++
			i += 2
			continue
		}
		r := hex4(lit[i:])
		if r < 0 {
			return "", b, false
		}
		i += 6
		if r < utf8.RuneSelf {
			out[w] = byte(r)
			w++
			continue
		}
		if utf16.IsSurrogate(r) {
			var used int
			r, used = surrogate(r, lit[i:])
			i += used
		}
		w += utf8.EncodeRune(out[w:], r)
	}
	// Escapes decode to whole runes: the result is valid exactly when
	// every run between them was.
	if !utf8.Valid(out[:w]) {
		return "", b, false
	}
	return unsafe.String(unsafe.SliceData(out), w), b[end+1:], true
}

// literalEnd finds the closing quote of the literal at the start of b,
// eight bytes at a time (escapeMask), and how many bytes its escapes save
// at least, decoded: one a short escape (two bytes to one), three a
// \uXXXX (six to at most three; a pair, twelve to four). end is -1 when b
// does not start with a quote, holds a control character before the end,
// or ends first. Its word loop is AppendMinimal's, not shared with it:
// AppendMinimal runs in plugins, where a call per escape found costs fuel.
func literalEnd(b []byte) (end, saved int) {
	if len(b) == 0 || b[0] != '"' {
		return -1, 0
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	i := 1
	for {
		for i+8 <= len(b) {
			w := *(*uint64)(unsafe.Add(p, i))
			if !littleEndian {
				w = bits.ReverseBytes64(w)
			}
			if m := escapeMask(w); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(b) && !mustEscape[b[i]] {
			i++
		}
		switch {
		case i == len(b) || b[i] < 0x20:
			return -1, 0
		case b[i] == '"':
			return i, saved
		}
		// A backslash: the byte after it is escaped (a quote, or the u of
		// \uXXXX, whose digits hold no quote or backslash).
		if i+1 == len(b) {
			return -1, 0
		}
		// Counted only for what is there: a malformed escape saves one,
		// the decoding stops at it, and what it wrote before fits.
		saved++
		if hex4(b[i:]) >= 0 {
			saved += 2
		}
		i += 2
	}
}

// hex4 decodes the escape \uXXXX at the start of s, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	a, b, c, d := hexValue[s[2]], hexValue[s[3]], hexValue[s[4]], hexValue[s[5]]
	if a == 0 || b == 0 || c == 0 || d == 0 {
		return -1
	}
	return rune(a-1)<<12 | rune(b-1)<<8 | rune(c-1)<<4 | rune(d-1)
}

// Tables as static data: a Go plugin links this package, and a table
// built at init would be built again in every fresh instance.
var (
	// shortEscapes holds the byte \c stands for; 0 for u and the invalid.
	shortEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}
	// hexValue holds a hex digit's value plus one; 0 for every other byte.
	hexValue = [256]int8{
		'0': 1, '1': 2, '2': 3, '3': 4, '4': 5, '5': 6, '6': 7, '7': 8, '8': 9, '9': 10,
		'a': 11, 'b': 12, 'c': 13, 'd': 14, 'e': 15, 'f': 16,
		'A': 11, 'B': 12, 'C': 13, 'D': 14, 'E': 15, 'F': 16,
	}
)

// escape decodes the escape at the start of s (s[0] is its backslash;
// literalEnd saw it whole): the rune, a surrogate pair's two halves
// decoded as one, and how many bytes it takes; used 0 for a \u escape
// that is not four hex digits. Unquote decodes its escapes inline, on
// the hot path; the cutting readers share this one.
func escape(s []byte) (r rune, used int) {
	if e := shortEscapes[s[1]]; e != 0 {
		return rune(e), 2
	}
	if r = hex4(s); r < 0 {
		return 0, 0
	}
	if utf16.IsSurrogate(r) {
		r, used = surrogate(r, s[6:])
	}
	return r, 6 + used
}

// surrogate decodes the surrogate r with the \uXXXX escape that may
// follow it in next: a pair decodes to its rune (used, the second
// escape's 6 bytes); a surrogate alone, as encoding/json decodes it, to
// U+FFFD (used 0).
func surrogate(r rune, next []byte) (decoded rune, used int) {
	if d := utf16.DecodeRune(r, hex4(next)); d != utf8.RuneError {
		return d, 6
	}
	return utf8.RuneError, 0
}
