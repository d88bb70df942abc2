package configschema

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ValidationError is a whole-document rule broken by one or more paths.
type ValidationError struct {
	// Paths are the concrete paths involved, most relevant first.
	Paths []string
	Err   error
}

func (e *ValidationError) Error() string { return e.Err.Error() }
func (e *ValidationError) Unwrap() error { return e.Err }

// Validate checks the rules that span the document: references name
// existing map entries, and unique fields differ across entries. It takes
// the effective document.
func Validate(doc map[string]any) error {
	for _, r := range rows {
		p := r.prop
		if p.Ref == "" && !p.Unique {
			continue
		}
		seen := map[string]string{}
		for _, segs := range expand(doc, r.segs) {
			path := strings.Join(segs, ".")
			v, ok := Get(doc, path)
			if !ok {
				continue
			}
			if p.Ref != "" {
				if err := checkRef(doc, p, path, v); err != nil {
					return err
				}
			}
			if p.Unique && v != nil {
				key := fmt.Sprint(v)
				if other, dup := seen[key]; dup {
					return &ValidationError{Paths: []string{path, other},
						Err: fmt.Errorf("%w: `%s` is %s, as is `%s`; it must be unique", ErrType, path, key, other)}
				}
				seen[key] = path
			}
		}
	}
	return checkFrameBudget(doc)
}

// checkFrameBudget: the unfinished-frame budget must hold one largest
// frame twice, its blocks and the slice they are copied into for a
// moment (gateway/jsonrpc.FrameBudget), or such a frame could never
// complete.
func checkFrameBudget(doc map[string]any) error {
	frame, ok1 := Get(doc, "rpc.max_frame_bytes")
	budget, ok2 := Get(doc, "rpc.max_buffered_frame_bytes")
	f, okf := asFloat(frame)
	b, okb := asFloat(budget)
	if !ok1 || !ok2 || !okf || !okb || b >= 2*f {
		return nil
	}
	return &ValidationError{Paths: []string{"rpc.max_buffered_frame_bytes", "rpc.max_frame_bytes"},
		Err: fmt.Errorf("%w: `rpc.max_buffered_frame_bytes` (%s) must be at least 2 × `rpc.max_frame_bytes` (%s)", ErrType, num(b), num(f))}
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	}
	return 0, false
}

func checkRef(doc map[string]any, p *Property, path string, v any) error {
	target, _ := Get(doc, p.Ref)
	entries, _ := target.(map[string]any)
	var names []any
	switch x := v.(type) {
	case []any:
		names = x
	default:
		names = []any{x}
	}
	for _, n := range names {
		s, _ := n.(string)
		if p.Wildcard && s == "*" {
			continue
		}
		if _, ok := entries[s]; !ok {
			return &ValidationError{Paths: []string{path},
				Err: fmt.Errorf("%w: `%s` names %q, which is not in `%s`", ErrReference, path, s, p.Ref)}
		}
	}
	return nil
}

// Related reports whether a failure at path can be blamed on a write of
// prop: one is the other or lies below it.
func Related(prop, path string) bool {
	return prop == path || strings.HasPrefix(path, prop+".") || strings.HasPrefix(prop, path+".")
}

// Blame returns the index of the last write among props that a
// validation error can be blamed on, or -1.
func Blame(err error, props []string) int {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return -1
	}
	for _, path := range ve.Paths {
		for i := len(props) - 1; i >= 0; i-- {
			if Related(props[i], path) {
				return i
			}
		}
	}
	// A write that removed what a reference needs: blame the referenced map.
	for i := len(props) - 1; i >= 0; i-- {
		for _, path := range ve.Paths {
			if p, err := Lookup(path); err == nil && p.Ref != "" && Related(props[i], p.Ref) {
				return i
			}
		}
	}
	return -1
}

// MatchPattern reports whether a config_paths pattern covers path: the
// pattern's segments match the path's first segments ("*" matches any
// one), so a pattern covers itself and everything below it.
func MatchPattern(pattern, path string) bool {
	ps := strings.Split(pattern, ".")
	segs := strings.Split(path, ".")
	if len(ps) > len(segs) {
		return false
	}
	for i, p := range ps {
		if p != "*" && p != segs[i] {
			return false
		}
	}
	return true
}

// Sorted returns the table's paths in order, for documentation and the CLI.
func Sorted() []string {
	out := make([]string, len(Properties))
	for i, p := range Properties {
		out[i] = p.Path
	}
	slices.Sort(out)
	return out
}
