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
