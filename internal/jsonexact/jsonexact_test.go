package jsonexact

import (
	"errors"
	"reflect"
	"testing"
)

func TestDecodeNamesWhere(t *testing.T) {
	_, err := Decode([]byte(`{"a":[1,{"b":9007199254740993}]}`))
	if err == nil || err.Error() != "at a[1].b: number cannot be held exactly: 9007199254740993 is not a float64 (integers are exact only within ±2^53 = ±9007199254740992)" {
		t.Fatalf("%v", err)
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want any
		err  error
	}{
		{`1000000000`, float64(1e9), nil},
		{`9007199254740992`, float64(1 << 53), nil},   // 2^53
		{`-9007199254740992`, -float64(1 << 53), nil}, // -2^53
		{`9007199254740993`, nil, ErrInexact},         // 2^53+1 rounds to 2^53
		{`-9007199254740993`, nil, ErrInexact},
		{`9007199254740994`, float64(1<<53 + 2), nil}, // a float64 exactly
		{`9007199254740993e0`, nil, ErrInexact},
		{`9007199254740992.5`, nil, ErrInexact},
		{`18446744073709551616`, float64(1 << 64), nil}, // 2^64 is a float64
		{`18446744073709551615`, nil, ErrInexact},       // 2^64-1 is not
		{`1e308`, nil, ErrInexact},                      // not exactly a float
		{`1e400`, nil, ErrInexact},
		{`0.1`, 0.1, nil}, // a fraction is a float's business
		{`1.5e3`, 1500.0, nil},
		{`{"a":[1,{"b":9007199254740993}]}`, nil, ErrInexact},
		{`{"a":[1,{"b":2}],"s":"x","t":true,"n":null}`, map[string]any{"a": []any{1.0, map[string]any{"b": 2.0}}, "s": "x", "t": true, "n": nil}, nil},
		{`[1] 2`, nil, ErrSyntax},
		{`{`, nil, ErrSyntax},
		{``, nil, ErrSyntax},
	} {
		got, err := Decode([]byte(tc.in))
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: %v %v, want %v", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %#v %v, want %#v", tc.in, got, err, tc.want)
		}
	}
}
