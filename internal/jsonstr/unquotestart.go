package jsonstr

import (
	"bytes"
	"unicode/utf8"
	"unsafe"
)

// UnquoteStart reads the JSON string literal at the start of b as Unquote
// does, but keeps only the first n bytes of what encoding/json's Unmarshal
// decodes it to (all of it when shorter; the n-th byte may fall inside a
// character), and says how many bytes the whole decodes to. ok is false
// for a literal encoding/json refuses (a control character, a malformed
// escape, no closing quote) and for anything not starting with a quote.
// Unlike Unquote it reads invalid UTF-8, replacing each bad byte with
// U+FFFD as encoding/json does, so that no input it is given costs more
// than n bytes. FuzzUnquoteStart holds it to encoding/json.
//
// The plugin sandbox reads a tool's output with it: the output may be 16
// MiB, and only the start its caller shows is kept, so the rest is
// measured without being written.
func UnquoteStart(b []byte, n int) (start string, total int, rest []byte, ok bool) {
	end, _ := literalEnd(b)
	if end < 0 {
		return "", 0, b, false
	}
	lit := b[1:end]
	n = max(n, 0)
	// The decoded text is at most three bytes per literal byte (a bad
	// byte becomes U+FFFD), and usually about the literal's length.
	out := make([]byte, 0, min(n, len(lit)))
	for i := 0; i < len(lit); {
		if lit[i] != '\\' {
			j := bytes.IndexByte(lit[i:], '\\')
			if j < 0 {
				j = len(lit) - i
			}
			run := lit[i : i+j]
			i += j
			if utf8.Valid(run) {
				total += len(run)
				if room := n - len(out); room > 0 {
					out = append(out, run[:min(room, len(run))]...)
				}
				continue
			}
			for len(run) > 0 {
				r, size := utf8.DecodeRune(run)
				run = run[size:]
				if r == utf8.RuneError && size == 1 {
					size = utf8.RuneLen(r)
				}
				total += size
				out = appendRuneCut(out, r, n)
			}
			continue
		}
		r, used := escape(lit[i:])
		if used == 0 {
			return "", 0, b, false
		}
		i += used
		total += utf8.RuneLen(r)
		out = appendRuneCut(out, r, n)
	}
	return unsafe.String(unsafe.SliceData(out), len(out)), total, b[end+1:], true
}

// appendRuneCut appends r's UTF-8 to out as far as out stays within n
// bytes.
func appendRuneCut(out []byte, r rune, n int) []byte {
	room := n - len(out)
	if room <= 0 {
		return out
	}
	if r < utf8.RuneSelf {
		return append(out, byte(r))
	}
	var buf [utf8.UTFMax]byte
	w := utf8.EncodeRune(buf[:], r)
	return append(out, buf[:min(w, room)]...)
}
