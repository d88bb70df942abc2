// Package ids defines the formats of the ids that cross process
// boundaries and that a client may send: every one of them may become a
// bus subject token, a folder name or an SQL value, so each is checked
// against its format at the edge and again where it is used.
package ids

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
)

// MaxLen bounds every id.
const MaxLen = 128

// Errors of the checks; each is wrapped with the offending field's name.
var (
	// ErrEmpty: the id is missing.
	ErrEmpty = errors.New("is required")
	// ErrFormat: the id breaks its format.
	ErrFormat = fmt.Errorf("must be 1 to %d letters, digits, '-' or '_'", MaxLen)
)

// Token reports whether s is 1 to MaxLen bytes of [A-Za-z0-9_-]: a string
// that can be one bus subject token and one path segment as it is.
func Token(s string) bool {
	if len(s) == 0 || len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Check returns nil when s is a valid token, else ErrEmpty or ErrFormat.
func Check(s string) error {
	switch {
	case s == "":
		return ErrEmpty
	case !Token(s):
		return ErrFormat
	}
	return nil
}

// LowerHex reports whether s is exactly n lowercase hexadecimal digits,
// the form of the random parts New and the services make (an upload_id,
// a temporary file's name).
func LowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// New returns prefix followed by 24 random hex digits; prefix must itself
// be made of token characters.
func New(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return prefix + hex.EncodeToString(b)
}
