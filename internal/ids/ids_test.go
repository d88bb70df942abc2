package ids

import (
	"errors"
	"strings"
	"testing"
)

func TestToken(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"sess_0123abcd", nil},
		{"A-b_9", nil},
		{strings.Repeat("a", MaxLen), nil},
		{"", ErrEmpty},
		{strings.Repeat("a", MaxLen+1), ErrFormat},
		{strings.Repeat("a", 5000), ErrFormat},
		{"*", ErrFormat},
		{">", ErrFormat},
		{"a.b", ErrFormat},
		{"a b", ErrFormat},
		{"a\x00b", ErrFormat},
		{"../x", ErrFormat},
		{"é", ErrFormat},
	} {
		if err := Check(tc.in); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Errorf("Check(%q) = %v, want %v", tc.in, err, tc.want)
		}
	}
	if id := New("sess_"); !Token(id) || !strings.HasPrefix(id, "sess_") || len(id) != len("sess_")+24 {
		t.Errorf("New = %q", id)
	}
}

func TestLowerHex(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want bool
	}{
		{"0123456789abcdef", 16, true},
		{"0123456789abcdef", 15, false},
		{"0123456789abcdeF", 16, false},
		{"0123456789abcdeg", 16, false},
		{"", 0, true},
		{"../../../etc/pas", 16, false},
	} {
		if got := LowerHex(tc.in, tc.n); got != tc.want {
			t.Errorf("LowerHex(%q, %d) = %v", tc.in, tc.n, got)
		}
	}
}
