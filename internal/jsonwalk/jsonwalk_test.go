package jsonwalk

import (
	"reflect"
	"testing"
)

// NextMember yields each member of a valid object, raw, whatever the
// space around it and whatever its value holds; SkipValue stops a scalar
// at what follows it.
func TestNextMember(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // key, value, key, value...
	}{
		{`{}`, nil},
		{` { } `, nil},
		{`{"a":1}`, []string{`"a"`, `1`}},
		{"{ \"a\" :\t[1, {\"}\":\"]\"}] ,\n\"b\\\"\":\"x\\\\\",\"c\":null}", []string{`"a"`, `[1, {"}":"]"}]`, `"b\""`, `"x\\"`, `"c"`, `null`}},
		{`{"n":-1.5e+3,"t":true}`, []string{`"n"`, `-1.5e+3`, `"t"`, `true`}},
	} {
		var got []string
		b := []byte(tc.in)
		start := SkipSpace(b, 0) + 1
		for key, val, i, ok := NextMember(b, start); ok; key, val, i, ok = NextMember(b, i) {
			got = append(got, string(key), string(val))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.in, got, tc.want)
		}
	}
}
