package configschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/jsonexact"
)

// Check validates v (a decoded JSON value: nil, bool, float64, int, int64,
// string, []any, map[string]any) against p and returns it in canonical
// form: integers as int64, numbers as float64, arrays as []any, objects
// as map[string]any. The error wraps ErrType and names what is wrong,
// not the path (the caller adds it).
func (p *Property) Check(v any) (any, error) {
	switch p.Type {
	case Array:
		items, ok := v.([]any)
		if !ok {
			return nil, typeErr("must be an array")
		}
		out := make([]any, len(items))
		for i, it := range items {
			c, err := p.checkScalar(p.Items, it)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			out[i] = c
		}
		return out, nil
	case Object:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, typeErr("must be an object")
		}
		out := make(map[string]any, len(obj))
		for k, it := range obj {
			if p.Items == "" {
				out[k] = it
				continue
			}
			c, err := p.checkScalar(p.Items, it)
			if err != nil {
				return nil, fmt.Errorf("key %q: %w", k, err)
			}
			out[k] = c
		}
		return out, nil
	case Map:
		return nil, fmt.Errorf("%w: a map of named entries is not set whole", ErrNotLeaf)
	}
	return p.checkScalar(p.Type, v)
}

// checkScalar checks one scalar of type t against p's constraints. Its
// errors read after the property's name ("`p`: must be a number").
func (p *Property) checkScalar(t Type, v any) (any, error) {
	switch t {
	case String:
		s, ok := v.(string)
		if !ok {
			return nil, typeErr("must be a string")
		}
		if len(p.Enum) > 0 && !slices.Contains(p.Enum, s) {
			return nil, typeErr("%q must be one of %s", s, strings.Join(p.Enum, ", "))
		}
		if p.MaxLen > 0 && utf8.RuneCountInString(s) > p.MaxLen {
			if p.Secret {
				return nil, typeErr("the secret is not in the expected form")
			}
			return nil, typeErr("%q is longer than %d characters", s, p.MaxLen)
		}
		if p.Pattern != nil && !p.Pattern.MatchString(s) {
			// The form in words: a secret's refusal cannot show the value.
			form := patternForms[p.Pattern]
			if p.Secret { // never echo a secret, not even a bad one
				return nil, typeErr("the secret is not in the expected form: %s", form)
			}
			return nil, typeErr("%q is not in the expected form: %s", s, form)
		}
		if p.Valid != nil {
			if err := p.Valid(s); err != nil {
				return nil, typeErr("%q: %v", s, err)
			}
		}
		return s, nil
	case Bool:
		b, ok := v.(bool)
		if !ok {
			return nil, typeErr("must be a boolean")
		}
		return b, nil
	case Integer, Number:
		var n float64
		switch x := v.(type) {
		case float64:
			n = x
		case int:
			n = float64(x)
		case int64:
			n = float64(x)
		case json.Number:
			f, err := x.Float64()
			if err != nil {
				return nil, typeErr("must be a number")
			}
			n = f
		default:
			return nil, typeErr("must be a number")
		}
		if math.IsNaN(n) || math.IsInf(n, 0) {
			return nil, typeErr("must be a finite number")
		}
		if t == Integer && n != math.Trunc(n) {
			return nil, typeErr("must be an integer")
		}
		if p.Min != nil && n < *p.Min {
			return nil, typeErr("%s is below the minimum %s", num(n), num(*p.Min))
		}
		if p.Max != nil && n > *p.Max {
			return nil, typeErr("%s is above the maximum %s", num(n), num(*p.Max))
		}
		if t == Integer {
			return int64(n), nil
		}
		return n, nil
	}
	return nil, typeErr("schema type %q is not a scalar", t)
}

func num(n float64) string { return strconv.FormatFloat(n, 'f', -1, 64) }

// ParseText reads a value typed on a command line (`--set prop=value`,
// `clawmesh config set prop=value`) for path: a string property takes the
// text as it is (or a JSON string when quoted); other types take JSON, and
// an array of strings also takes a comma-separated list. The result is
// checked against the schema.
func ParseText(path, raw string) (any, error) {
	p, err := LookupLeaf(path)
	if err != nil {
		return nil, err
	}
	// Text in another encoding (Latin-1 from a terminal or a --set-file)
	// reached the daemon as JSON, which has no way to carry it: each
	// byte that is not UTF-8 became U+FFFD, stored without a word.
	if !utf8.ValidString(raw) {
		return nil, fmt.Errorf("`%s`: %w: the text is not UTF-8", path, ErrType)
	}
	var v any
	switch {
	case p.Type == String:
		v = raw
		if strings.HasPrefix(raw, `"`) {
			var s string
			if json.Unmarshal([]byte(raw), &s) == nil {
				v = s
			}
		}
	case p.Type == Array && p.Items == String && !strings.HasPrefix(strings.TrimSpace(raw), "["):
		items := []any{}
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		v = items
	default:
		var err error
		if v, err = jsonexact.Decode([]byte(raw)); errors.Is(err, jsonexact.ErrInexact) {
			return nil, fmt.Errorf("`%s`: %w", path, err)
		} else if err != nil {
			return nil, fmt.Errorf("`%s`: %w: %q is not JSON of type %s", path, ErrType, raw, p.Type)
		}
	}
	c, err := p.Check(v)
	if err != nil {
		return nil, fmt.Errorf("`%s`: %w", path, err)
	}
	return c, nil
}

// typeError is a value that breaks its property's type or constraints;
// it matches ErrType and reads as its message alone.
type typeError struct{ msg string }

func (e *typeError) Error() string        { return e.msg }
func (e *typeError) Is(target error) bool { return target == ErrType }

func typeErr(format string, args ...any) error {
	return &typeError{msg: fmt.Sprintf(format, args...)}
}
