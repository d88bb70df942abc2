package pgtext

import "testing"

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"plain":            "plain",
		"nul\x00here":      "nul\uFFFDhere",
		"bad\xffutf8":      "bad\uFFFDutf8",
		"\x00\xff\xfe\x00": "\uFFFD\uFFFD\uFFFD",
		"":                 "",
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}
