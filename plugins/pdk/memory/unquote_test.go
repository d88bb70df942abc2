package memory

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkUnquote requires unquote to decode the literal lit as encoding/json
// does, or to refuse what it refuses.
func checkUnquote(t *testing.T, lit string) {
	t.Helper()
	var want string
	wantErr := json.Unmarshal([]byte(lit), &want)
	got, err := unquote([]byte(lit)) // a copy: unquote decodes in place
	if wantErr != nil {
		if err == nil {
			t.Errorf("unquote(%q) = %q, encoding/json refuses it: %v", lit, got, wantErr)
		}
		return
	}
	if err != nil || got != want {
		t.Errorf("unquote(%q) = %q, %v; encoding/json %q", lit, got, err, want)
	}
}

func TestUnquote(t *testing.T) {
	for _, lit := range []string{
		`""`, `"plain"`, `"a\"b\\c\/d"`, `"\b\f\n\r\t"`, `"\u0001\u001f\u00e9\u00E9\u65e5"`,
		`"\ud83d\ude00 pair"`, `"\ud83d lone high"`, `"\ude00 lone low"`, `"\ud83d\u0041 high then not low"`,
		`"\ud83d\ud83d\ude00 two highs"`, `"run of bytes then\nescape\tand\u2028"`, `"日本語\n"`,
		// Malformed: refused.
		`"\x"`, `"\u12"`, `"\u12g4"`, `"trailing\"`, `"\`,
	} {
		checkUnquote(t, lit)
	}
	for _, bad := range []string{``, `"`, `x`, `"abc`, `abc"`, `null`, `12`} {
		if got, err := unquote([]byte(bad)); err == nil {
			t.Errorf("unquote(%q) = %q, want an error", bad, got)
		}
	}
}

// FuzzUnquote: any string, as the host's encoder writes it and as it may
// be escaped otherwise, decodes to what encoding/json gives.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{"", "a", "\x01\n\"\\", "<a&b>", "é日\U0001F600", "\xff\xfe", `\ud800`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Skip()
		}
		checkUnquote(t, string(b))
		// The text taken as a literal's inside, its escapes as written,
		// when it could be one: valid UTF-8 (the host's encoder writes no
		// other), no control character, no quote (the parser ends a
		// literal at the first unescaped one).
		if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == '"' }) {
			return
		}
		checkUnquote(t, `"`+s+`"`)
	})
}
