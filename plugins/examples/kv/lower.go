package main

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// lower is strings.ToLower, at a small part of its fuel for the text a
// memory holds. strings.ToLower goes rune by rune through a builder for
// any text that is not ASCII, and unicode.ToLower searches the case
// table for each rune: about 1,300 units a rune, so a 1 MiB store of
// accented, Greek or Cyrillic text cost 580 to 670 million (Ⱥ 785), most
// of the call's fuel. lower changes the text in its own copy: ASCII by
// itself, a two-byte rune through a table made at the first need, a
// rune where no rune has case (caseless) kept, any other through
// unicode.ToLower; from the first rune whose lower case is longer or
// shorter (Ⱥ, İ, K) it writes a new copy. Text that is not UTF-8 goes to
// strings.ToLower, whose answer lower gives in every case.
func lower(s string) string {
	b := []byte(s)
	var two *[0x800]rune
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			// A run of ASCII, in a range loop: the fewest units a byte.
			run := b[i:]
			n := len(run)
			for k, c := range run {
				if c >= utf8.RuneSelf {
					n = k
					break
				}
				if 'A' <= c && c <= 'Z' {
					run[k] = c + 'a' - 'A'
				}
			}
			i += n
			continue
		}
		if c >= 0xC2 && c < 0xE0 && i+1 < len(b) && b[i+1]&0xC0 == 0x80 {
			// Two bytes, decoded here: utf8's calls cost more than the
			// rest of the rune's work.
			if two == nil {
				two = lowerTwo()
			}
			r := rune(c&0x1F)<<6 | rune(b[i+1]&0x3F)
			if l := two[r]; l != r {
				if l < 0x80 || l >= 0x800 {
					return lowerFrom(s, b, i)
				}
				b[i], b[i+1] = 0xC0|byte(l>>6), 0x80|byte(l&0x3F)
			}
			i += 2
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return strings.ToLower(s)
		}
		if !caseless(r) {
			if l := unicode.ToLower(r); l != r {
				if utf8.RuneLen(l) != n {
					return lowerFrom(s, b, i)
				}
				utf8.EncodeRune(b[i:], l)
			}
		}
		i += n
	}
	return string(b)
}

// lowerFrom finishes lower in a new copy, from b[i], the first rune
// whose lower case is not as long as it is (b[:i] is done).
func lowerFrom(s string, b []byte, i int) string {
	two := lowerTwo()
	out := make([]byte, i, len(b)+len(b)/2+utf8.UTFMax)
	copy(out, b[:i])
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		if c >= 0xC2 && c < 0xE0 && i+1 < len(b) && b[i+1]&0xC0 == 0x80 {
			out = utf8.AppendRune(out, two[rune(c&0x1F)<<6|rune(b[i+1]&0x3F)])
			i += 2
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return strings.ToLower(s)
		}
		if !caseless(r) {
			r = unicode.ToLower(r)
		}
		out = utf8.AppendRune(out, r)
		i += n
	}
	return string(out)
}

// lowerTwo is unicode.ToLower of each rune of two UTF-8 bytes (U+0080
// to U+07FF, indexed by the rune), made at the first need (about 3
// million units, once an instance).
func lowerTwo() *[0x800]rune {
	if twoByte == nil {
		t := new([0x800]rune)
		for r := rune(0x80); r < 0x800; r++ {
			t[r] = unicode.ToLower(r)
		}
		twoByte = t
	}
	return twoByte
}

var twoByte *[0x800]rune

// caseless reports whether r, of three or four UTF-8 bytes, is where no
// rune has a lower case of its own: a block of 256 (U+0800 to U+FFFF)
// marked in caselessBlocks, 237 of the 248 (CJK, kana, Hangul,
// punctuation, symbols), or a stretch of the planes above (emoji among
// them). TestCaselessRanges checks each rune against unicode.ToLower.
func caseless(r rune) bool {
	if r < 0x10000 {
		k := r >> 8
		return caselessBlocks[k>>6]>>(k&63)&1 != 0
	}
	return r < 0x10400 || 0x118C0 <= r && r < 0x16E40 || 0x16E60 <= r && r < 0x1E900 || 0x1E922 <= r
}

// caselessBlocks has bit k set when no rune from k<<8 to k<<8+255 has a
// lower case of its own (k from 8; made with unicode.ToLower).
var caselessBlocks = [4]uint64{0xffffefed2ff6ff00, 0xffffffffffffffff, 0xffffff3fffffffff, 0x7fffffffffffffff}
