// Package configschema is the typed config document's schema: every property
// path with its type, default, validation and secret flag.
//
// The schema is data: Properties is one table that the config service
// validates against and the CLI reads to parse values typed on a command
// line. Adding a property is adding one row.
//
// Paths are dotted. A "*" segment stands for the name of an entry of a
// map of named entries: "users.*.uid" is the uid of every users.<name>.
package configschema

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Type is a property's JSON type.
type Type string

// The property types.
const (
	String  Type = "string"
	Bool    Type = "bool"
	Integer Type = "integer"
	Number  Type = "number"
	// Array is a JSON array whose items are of the property's Items type.
	Array Type = "array"
	// Object is a JSON object; with Items set, every value is of that type
	// (plugins.entries.<key>.config is an object of strings).
	Object Type = "object"
	// Map is a map of named entries; each entry's fields are the rows whose
	// path continues with ".*.". Its Default lists the entries that exist
	// out of the box.
	Map Type = "map"
)

// Masked is what a secret reads as everywhere but Reveal.
const Masked = "***MASKED***"

// Property is one row of the schema.
type Property struct {
	// Path is the dotted path, "*" for a map entry's name.
	Path string
	Type Type
	// Items is the type of an Array's items or of an Object's values.
	Items Type
	// Default is the value a leaf reads as until it is set; nil leaves the
	// property absent. For a Map, a []string of entry names that exist
	// out of the box.
	Default any
	// Secret values are encrypted at rest and read as Masked.
	Secret bool
	// Restart marks a property that the services read only at start: a
	// change is stored at once and applied at the next restart.
	Restart bool
	// Min and Max bound an Integer or Number (inclusive) when set.
	Min, Max *float64
	// Enum lists the allowed strings of a String, or of an Array's items.
	Enum []string
	// Pattern, when set, must match a String (or each string item).
	Pattern *regexp.Regexp
	// Valid, when set, must accept a String (or each string item) that
	// passed Pattern; its error says what is wrong with the value.
	Valid func(string) error
	// MaxLen, when set, is the most characters a String (or each string
	// item) may have.
	MaxLen int
	// Ref names a Map whose entry names a String (or each string item)
	// must be; Wildcard also allows "*".
	Ref      string
	Wildcard bool
	// Unique requires the values of this property to differ across the
	// entries of its map (users.*.uid).
	Unique bool
	Doc    string
}

// Leaf reports whether the property holds a value (everything but Map).
func (p *Property) Leaf() bool { return p.Type != Map }

// Errors of this package; wrapped with the offending path.
var (
	// ErrUnknown: no schema row matches the path.
	ErrUnknown = errors.New("unknown config property")
	// ErrNotLeaf: the path names a group or a map, not a value.
	ErrNotLeaf = errors.New("not a settable property")
	// ErrType: the value has the wrong type or breaks a constraint.
	ErrType = errors.New("invalid value")
	// ErrReference: a reference names something that does not exist.
	ErrReference = errors.New("invalid reference")
)

// nameSegment is what a map entry's name may be: it is one path segment,
// of at most maxName characters (ASCII: bytes).
var nameSegment = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_:@-]*$`)

const maxName = 64

// ValidName reports whether s can name a map entry.
func ValidName(s string) bool { return len(s) <= maxName && nameSegment.MatchString(s) }

// row is a table row split into segments.
type row struct {
	segs []string
	prop *Property
}

// node is the table as a tree of segments, for lookups.
type node struct {
	children map[string]*node
	prop     *Property
}

var rows, root = func() ([]row, *node) {
	out := make([]row, len(Properties))
	top := &node{children: map[string]*node{}}
	for i := range Properties {
		p := &Properties[i]
		out[i] = row{segs: strings.Split(p.Path, "."), prop: p}
		n := top
		for _, seg := range out[i].segs {
			next, ok := n.children[seg]
			if !ok {
				next = &node{children: map[string]*node{}}
				n.children[seg] = next
			}
			n = next
		}
		if n.prop != nil {
			panic("schema: duplicate path " + p.Path)
		}
		n.prop = p
	}
	return out, top
}()

// find walks the tree along segs: a literal segment first, else "*" for a
// valid entry name (a path may also name "*" itself, as patterns do).
func find(n *node, segs []string) *node {
	if len(segs) == 0 {
		return n
	}
	if next, ok := n.children[segs[0]]; ok {
		if found := find(next, segs[1:]); found != nil {
			return found
		}
	}
	if next, ok := n.children["*"]; ok && ValidName(segs[0]) {
		return find(next, segs[1:])
	}
	return nil
}

// Split splits a dotted path, refusing empty segments.
func Split(path string) ([]string, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: empty path", ErrUnknown)
	}
	segs := strings.Split(path, ".")
	for _, s := range segs {
		if s == "" {
			return nil, fmt.Errorf("%w: `%s` has an empty segment", ErrUnknown, path)
		}
	}
	return segs, nil
}

// Lookup returns the row that a concrete path (or a pattern) names.
func Lookup(path string) (*Property, error) {
	segs, err := Split(path)
	if err != nil {
		return nil, err
	}
	if n := find(root, segs); n != nil && n.prop != nil {
		return n.prop, nil
	}
	return nil, fmt.Errorf("%w `%s`", ErrUnknown, path)
}

// LookupLeaf returns the row of a settable path: a concrete one, whose
// entry names are names. A "*" segment is the schema's stand-in for any
// name, which Lookup also takes literally (patterns name rows with it);
// written, it made an entry named "*" (agents.*, users.*), which no valid
// name can be and which config/delete, taking only valid names, could
// then never remove.
func LookupLeaf(path string) (*Property, error) {
	p, err := Lookup(path)
	if err != nil {
		// A group or a map entry is something config/get reads: called
		// unknown, written or deleted, it read as a typo.
		if Readable(path) {
			return nil, fmt.Errorf("%w: `%s` is a group of properties, not one; name one of them (clawmesh config schema lists them)", ErrNotLeaf, path)
		}
		return nil, err
	}
	if slices.Contains(strings.Split(path, "."), "*") {
		return nil, fmt.Errorf("%w `%s`: `*` stands for an entry's name in the schema; name the entry", ErrUnknown, path)
	}
	if !p.Leaf() {
		return nil, fmt.Errorf("%w: `%s` is a map of named entries; set its entries' fields", ErrNotLeaf, path)
	}
	return p, nil
}

// Readable reports whether path names a property, a map entry or a group
// of properties (such as "plugins.limits" or "agents.default"): something
// config/get can return.
func Readable(path string) bool {
	segs, err := Split(path)
	if err != nil {
		return false
	}
	return find(root, segs) != nil
}

// EntryMap returns the Map row when path names one entry of a map of
// named entries ("users.alice"), else nil.
func EntryMap(path string) *Property {
	segs, err := Split(path)
	if err != nil || len(segs) < 2 {
		return nil
	}
	// "*" too, though no entry may be named so now (LookupLeaf): an older
	// version stored such entries, and deleting is how they go.
	if last := segs[len(segs)-1]; !ValidName(last) && last != "*" {
		return nil
	}
	p, err := Lookup(strings.Join(segs[:len(segs)-1], "."))
	if err != nil || p.Type != Map {
		return nil
	}
	return p
}

func f(v float64) *float64 { return &v }
