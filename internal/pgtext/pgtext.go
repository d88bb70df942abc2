// Package pgtext makes strings storable as PostgreSQL text and jsonb. It
// is the one rule for every service that keeps a client's text: the
// session service's rows and the durable bridge's queued texts turn a text
// into the same stored string.
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Text returns s with NUL and invalid UTF-8, which PostgreSQL's text and
// jsonb refuse, each replaced by U+FFFD.
func Text(s string) string {
	if utf8.ValidString(s) && !strings.Contains(s, "\x00") {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
