package durablebridge

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text limits of seed 004, in bytes.
const (
	maxChatText  = 64 << 10 // user, reply, thinking, notice items
	maxCodeText  = 32 << 10 // markdown, code, and tool items
	maxPhoneText = 32 << 10 // text the phone sends
	maxTitle     = 64       // host name, pane, tab and workspace titles
	maxAskTitle  = 256
	maxAskBody   = 2 << 10
	maxToolArgs  = 2 << 10 // an ask's tool.arguments are shown only up to this
	maxLine      = 256     // starter descriptions
)

// clean removes what a phone must not render (control characters other
// than newline and tab, invisible and bidirectional formatting
// characters, invalid UTF-8) and cuts the result to at most limit bytes
// on a character boundary.
func clean(s string, limit int) string {
	if len(s) <= limit && plain(s) {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), limit))
	for _, r := range s {
		if r == utf8.RuneError || hidden(r) {
			continue
		}
		if b.Len()+utf8.RuneLen(r) > limit {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// cleanLine is clean for one-line text: newlines and tabs become spaces.
func cleanLine(s string, limit int) string {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(clean(s, limit))
}

// plain reports whether s is valid UTF-8 with nothing clean would remove.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return plainSlow(s[i:])
		}
		if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func plainSlow(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if hidden(r) {
			return false
		}
	}
	return true
}

// hidden reports characters that are not shown as themselves: controls
// (but newline and tab) and format characters (zero-width, bidi
// overrides, byte-order mark).
func hidden(r rune) bool {
	if r == '\n' || r == '\t' {
		return false
	}
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}
