package abi

import "unicode/utf8"

// AppendJSON appends e as JSON: the same bytes encoding/json's Marshal
// gives for it (FuzzToolEnvelopeJSON holds the two together).
//
// A Go guest returns this envelope from every tool call, in a fresh
// instance. Through encoding/json it cost a seventh of the echo tool's
// whole call (13 thousand of its 90 thousand fuel units: reflection, the
// encoder cache's lookups, a buffer grown by copying); written out here
// it costs about 2,700, most of it the output's bytes, one at a time.
func (e ToolEnvelope) AppendJSON(dst []byte) []byte {
	switch {
	case e.Ok != nil && e.Err != nil:
		dst = append(dst, `{"ok":`...)
		dst = e.Ok.AppendJSON(dst)
		dst = append(dst, `,"err":`...)
		return append(appendJSONString(dst, *e.Err), '}')
	case e.Ok != nil:
		dst = append(dst, `{"ok":`...)
		return append(e.Ok.AppendJSON(dst), '}')
	case e.Err != nil:
		dst = append(dst, `{"err":`...)
		return append(appendJSONString(dst, *e.Err), '}')
	}
	return append(dst, "{}"...)
}

// AppendJSON appends r as JSON, as encoding/json would write it.
func (r ToolResult) AppendJSON(dst []byte) []byte {
	if r.Success {
		dst = append(dst, `{"success":true,"output":`...)
	} else {
		dst = append(dst, `{"success":false,"output":`...)
	}
	dst = appendJSONString(dst, r.Output)
	dst = append(dst, `,"error":`...)
	if r.Error == nil {
		dst = append(dst, "null"...)
	} else {
		dst = appendJSONString(dst, *r.Error)
	}
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string with encoding/json's
// escapes: quote and backslash; control characters (\b \f \n \r \t by
// name, the rest as \u00XX); <, > and & as \u00XX, which keeps the text
// inert inside HTML; U+2028 and U+2029, which end a line in JavaScript;
// and each byte of invalid UTF-8 as \ufffd, the replacement character.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
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
