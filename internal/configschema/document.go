package configschema

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// A document is the config as nested JSON objects (map[string]any). The
// stored document holds only what was set; the effective one adds the
// defaults. Both are plain values: copy with Clone before changing one
// that is shared.

// MaxDocumentBytes bounds the stored document, as JSON. Every service
// reads the whole document in one gRPC message (Live), whose bound is 16
// MiB (internal/grpcserver); the document also travels with its secrets
// sealed (about a third larger), with its defaults, and as protobuf
// Struct values, so a quarter of that keeps it readable with room to
// spare. A config past it could not be loaded at all: not by the running
// services, nor by the next start.
const MaxDocumentBytes = 4 << 20

// DocumentBytes is the size MaxDocumentBytes bounds.
func DocumentBytes(doc map[string]any) (int, error) {
	b, err := json.Marshal(doc)
	return len(b), err
}

// Clone deep-copies a document.
func Clone(doc map[string]any) map[string]any {
	out := make(map[string]any, len(doc))
	for k, v := range doc {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return Clone(x)
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = cloneValue(it)
		}
		return out
	}
	return v
}

// Get returns the value at path.
func Get(doc map[string]any, path string) (any, bool) {
	var cur any = doc
	for _, seg := range strings.Split(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = obj[seg]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// Set puts v at path, creating objects on the way.
func Set(doc map[string]any, path string, v any) error {
	segs := strings.Split(path, ".")
	cur := doc
	for i, seg := range segs[:len(segs)-1] {
		next, ok := cur[seg].(map[string]any)
		if !ok {
			if _, exists := cur[seg]; exists {
				return fmt.Errorf("`%s` is not an object", strings.Join(segs[:i+1], "."))
			}
			next = map[string]any{}
			cur[seg] = next
		}
		cur = next
	}
	cur[segs[len(segs)-1]] = v
	return nil
}

// Delete removes path and any object left empty above it; it reports
// whether something was removed.
func Delete(doc map[string]any, path string) bool {
	segs := strings.Split(path, ".")
	var del func(obj map[string]any, i int) bool
	del = func(obj map[string]any, i int) bool {
		if i == len(segs)-1 {
			_, ok := obj[segs[i]]
			delete(obj, segs[i])
			return ok
		}
		child, ok := obj[segs[i]].(map[string]any)
		if !ok || !del(child, i+1) {
			return false
		}
		// An emptied group goes; an emptied map entry stays: it still
		// exists, with its defaults.
		if len(child) == 0 && EntryMap(strings.Join(segs[:i+1], ".")) == nil {
			delete(obj, segs[i])
		}
		return true
	}
	return del(doc, 0)
}

// Walk calls fn for every leaf value in doc with its path and row, in
// path order; a value that no row describes is reported with a nil row.
func Walk(doc map[string]any, fn func(path string, p *Property, v any)) {
	var walk func(prefix []string, obj map[string]any)
	walk = func(prefix []string, obj map[string]any) {
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			segs := append(slices.Clone(prefix), k)
			path := strings.Join(segs, ".")
			v := obj[k]
			p, err := Lookup(path)
			switch {
			case err == nil && p.Leaf():
				fn(path, p, v)
			case (err == nil || Readable(path)) && isObject(v):
				walk(segs, v.(map[string]any))
			default:
				fn(path, nil, v)
			}
		}
	}
	walk(nil, doc)
}

func isObject(v any) bool { _, ok := v.(map[string]any); return ok }

// Normalize checks every value of a stored document against the schema
// and returns a copy in canonical form. The error names the first bad
// path.
func Normalize(stored map[string]any) (map[string]any, error) {
	out := map[string]any{}
	var first error
	Walk(stored, func(path string, p *Property, v any) {
		if first != nil {
			return
		}
		if p == nil {
			first = fmt.Errorf("%w `%s`", ErrUnknown, path)
			return
		}
		c, err := p.Check(v)
		if err != nil {
			first = fmt.Errorf("`%s`: %w", path, err)
			return
		}
		_ = Set(out, path, c)
	})
	return out, first
}

// defaults in canonical form, checked once: a bad default is a bug in the
// table.
var defaults = func() map[string]any {
	out := map[string]any{}
	for i := range Properties {
		p := &Properties[i]
		if p.Default == nil || !p.Leaf() {
			continue
		}
		c, err := p.Check(p.Default)
		if err != nil {
			panic(fmt.Sprintf("schema: default of %s: %v", p.Path, err))
		}
		out[p.Path] = c
	}
	return out
}()

// Effective returns the stored document completed with defaults: every
// entry a Map has out of the box, and every field with a default that is
// not set, in every existing map entry.
func Effective(stored map[string]any) map[string]any {
	doc := Clone(stored)
	for _, r := range rows {
		if r.prop.Type == Map {
			names, _ := r.prop.Default.([]string)
			for _, parent := range expand(doc, r.segs[:len(r.segs)-1]) {
				m := ensureObject(doc, append(parent, r.segs[len(r.segs)-1]))
				for _, n := range names {
					if _, ok := m[n]; !ok {
						m[n] = map[string]any{}
					}
				}
			}
		}
	}
	for _, r := range rows {
		def, ok := defaults[r.prop.Path]
		if !ok {
			continue
		}
		for _, parent := range expand(doc, r.segs[:len(r.segs)-1]) {
			obj := ensureObject(doc, parent)
			if _, set := obj[r.segs[len(r.segs)-1]]; !set {
				obj[r.segs[len(r.segs)-1]] = cloneValue(def)
			}
		}
	}
	return doc
}

// expand turns a pattern into the concrete paths that exist in doc: each
// "*" becomes every entry name present at that point.
func expand(doc map[string]any, pattern []string) [][]string {
	paths := [][]string{{}}
	for _, seg := range pattern {
		var next [][]string
		for _, p := range paths {
			if seg != "*" {
				next = append(next, append(slices.Clone(p), seg))
				continue
			}
			v, _ := Get(doc, strings.Join(p, "."))
			if len(p) == 0 {
				v = doc
			}
			obj, _ := v.(map[string]any)
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				if isObject(obj[k]) {
					next = append(next, append(slices.Clone(p), k))
				}
			}
		}
		paths = next
	}
	return paths
}

func ensureObject(doc map[string]any, segs []string) map[string]any {
	cur := doc
	for _, s := range segs {
		next, ok := cur[s].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[s] = next
		}
		cur = next
	}
	return cur
}

// Mask returns a copy of doc with every secret replaced by Masked: a
// secret string reads Masked when it is not empty, and each value of a
// secret object reads Masked (its keys stay visible).
func Mask(doc map[string]any) map[string]any {
	out := Clone(doc)
	Walk(doc, func(path string, p *Property, v any) {
		if p == nil || !p.Secret {
			return
		}
		_ = Set(out, path, MaskValue(v))
	})
	return out
}

// MaskValue masks one secret value.
func MaskValue(v any) any {
	switch x := v.(type) {
	case string:
		if x == "" {
			return ""
		}
		return Masked
	case map[string]any:
		out := make(map[string]any, len(x))
		for k := range x {
			out[k] = Masked
		}
		return out
	case nil:
		return nil
	}
	return Masked
}

// Entry is one leaf of a document.
type Entry struct {
	Prop  string
	Value any
}

// Flatten lists the leaves of doc in path order.
func Flatten(doc map[string]any) []Entry {
	var out []Entry
	Walk(doc, func(path string, p *Property, v any) {
		if p != nil {
			out = append(out, Entry{Prop: path, Value: v})
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Prop < out[j].Prop })
	return out
}

// Equal reports whether two documents hold the same values.
func Equal(a, b map[string]any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
