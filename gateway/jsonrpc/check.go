package jsonrpc

import (
	"bytes"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/internal/jsonwalk"
)

// MaxParamsDepth is how deeply CheckParams lets a member of params nest:
// {"value":[[1]]} nests 2 levels in value. 64 is far beyond any method's
// shape and keeps every later decoder's recursion shallow.
const MaxParamsDepth = 64

// ParamsProblem says what CheckParams found.
type ParamsProblem uint8

const (
	// ParamsDuplicateKey: an object has the same key twice (compared after
	// unescaping, as encoding/json compares them). In params itself, keys
	// equal under Unicode case folding are the same key (see CheckParams).
	ParamsDuplicateKey ParamsProblem = iota + 1
	// ParamsNUL: a string or a key holds U+0000, which PostgreSQL text and
	// jsonb cannot store.
	ParamsNUL
	// ParamsTooDeep: a member nests deeper than MaxParamsDepth.
	ParamsTooDeep
)

// ParamsError is a params value CheckParams refuses. Its Error text names
// the field and is meant for the client (a -32602 message).
type ParamsError struct {
	Problem ParamsProblem
	// Path locates the problem in dotted form: "value.a", "sets[2].value.x";
	// "" is params itself. For ParamsDuplicateKey it ends with the repeated
	// key; for ParamsNUL it is the string holding the NUL, or the object
	// whose key holds it; for ParamsTooDeep it is the top-level member of
	// params (the field the client set). Long keys are cut short, so a
	// path is at most about maxPathBytes.
	Path string
}

func (e *ParamsError) Error() string {
	name := "params"
	if e.Path != "" {
		name = "`" + e.Path + "`"
	}
	switch e.Problem {
	case ParamsDuplicateKey:
		return name + " appears twice"
	case ParamsNUL:
		return name + " must not contain NUL characters"
	case ParamsTooDeep:
		return name + " nests deeper than " + strconv.Itoa(MaxParamsDepth) + " levels"
	}
	return name + " is not acceptable"
}

// Bounds on the text of a ParamsError path.
const (
	maxPathKeyBytes = 64
	maxPathBytes    = 256
)

// keyListMax is how many keys an object compares by a linear search before
// they go into a map.
const keyListMax = 16

// CheckParams refuses, before anything unmarshals it, a params value with
// a duplicate key in any object, a NUL character (U+0000, escaped or raw)
// in any string or key, or a member nesting deeper than MaxParamsDepth.
// It returns nil or a *ParamsError for the first problem in document order.
//
// The keys of the outermost object are duplicates when they are equal
// under Unicode case folding (bytes.EqualFold): that object is decoded
// into a struct, and encoding/json matches a field to any such key, the
// last one winning ("session_id" and "SESSION_ID", or "ſession_id"
// with a long s). Deeper objects may be maps, whose keys are told apart
// by case ("PATH" and "Path" in an env), so there only equal keys are.
// A caller decoding a nested value into structs checks it with
// CheckStructs.
//
// It is one left-to-right scan with an explicit stack bounded by
// MaxParamsDepth: no recursion, so a 9000-deep value costs neither stack
// nor more than one pass. raw should be valid JSON (Classify has checked
// the frame); on invalid JSON CheckParams stops at the first byte it does
// not expect and returns nil, leaving the syntax error to the decoder.
func CheckParams(raw []byte) error { return CheckStructs(raw, 1) }

// CheckStructs is CheckParams for a value decoded into structs down to
// depth containers: keys of an object opened at most depth containers
// deep (raw's own container is 1) are duplicates when equal under case
// folding, deeper ones only when equal. An array of objects each decoded
// into a struct takes 2, as its objects are one container inside it.
func CheckStructs(raw []byte, depth int) error {
	s := scanPool.Get().(*paramScan)
	s.foldDepth = depth
	err := s.run(raw)
	s.reset()
	scanPool.Put(s)
	return err
}

// reset drops every reference into the scanned value, for reuse.
func (s *paramScan) reset() {
	clear(s.stack[:cap(s.stack)])
	clear(s.keys[:cap(s.keys)])
	s.b, s.stack, s.keys = nil, s.stack[:0], s.keys[:0]
}

// scanPool keeps scanners: their stack is at most MaxParamsDepth+1 frames
// and their key list at most keyListMax keys a level, so none grows large.
var scanPool = sync.Pool{New: func() any {
	return &paramScan{stack: make([]scanFrame, 0, 8), keys: make([][]byte, 0, 32)}
}}

// scanFrame is one open container.
type scanFrame struct {
	obj    bool
	keysAt int    // obj: its keys are keys[keysAt:]
	key    []byte // obj: the current member's key, decoded
	index  int    // array: the current element's index
	set    map[string]struct{}
}

type paramScan struct {
	b         []byte
	stack     []scanFrame
	keys      [][]byte
	foldDepth int // objects at most this deep fold their keys
}

func (s *paramScan) run(b []byte) error {
	s.b = b
	i := jsonwalk.SkipSpace(b, 0)
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return nil
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(s.stack) > MaxParamsDepth {
				return s.fail(ParamsTooDeep, len(s.stack))
			}
			s.stack = append(s.stack, scanFrame{obj: c == '{', keysAt: len(s.keys)})
			i = jsonwalk.SkipSpace(b, i+1)
			if i < len(b) && (b[i] == '}' || b[i] == ']') {
				s.pop()
				i++
				break
			}
			if c == '[' {
				continue // the first element
			}
			var err error
			if i, err = s.key(i); err != nil || i < 0 {
				return err
			}
			continue
		case c == '"':
			end, nul := scanString(b, i)
			if nul {
				return s.fail(ParamsNUL, len(s.stack))
			}
			i = end
		default:
			start := i
			i = jsonwalk.SkipValue(b, i)
			if i == start {
				return nil // not JSON: the decoder will say so
			}
		}
		// After a value: a separator, or the end of containers.
		for {
			i = jsonwalk.SkipSpace(b, i)
			if len(s.stack) == 0 || i >= len(b) {
				return nil
			}
			top := &s.stack[len(s.stack)-1]
			switch {
			case b[i] == ',' && top.obj:
				var err error
				if i, err = s.key(jsonwalk.SkipSpace(b, i+1)); err != nil || i < 0 {
					return err
				}
			case b[i] == ',':
				top.index++
				i = jsonwalk.SkipSpace(b, i+1)
			case (b[i] == '}' && top.obj) || (b[i] == ']' && !top.obj):
				s.pop()
				i++
				continue
			default:
				return nil
			}
			break
		}
	}
}

// key reads the member key at b[i] of the innermost object, checks it,
// and returns the index of the member's value (or -1 on bad syntax).
func (s *paramScan) key(i int) (int, error) {
	b := s.b
	if i >= len(b) || b[i] != '"' {
		return -1, nil
	}
	end, nul := scanString(b, i)
	if nul {
		return -1, s.fail(ParamsNUL, len(s.stack)-1)
	}
	k := b[i+1 : max(i+1, end-1)]
	if bytes.IndexByte(k, '\\') >= 0 || !utf8.Valid(k) {
		// Compare as encoding/json will: unescaped, bad UTF-8 replaced.
		d, ok := decodeString(b[i:end])
		if ok {
			k = []byte(d)
		}
	}
	top := &s.stack[len(s.stack)-1]
	top.key = k
	if s.seen(top, k, len(s.stack) <= s.foldDepth) {
		return -1, s.fail(ParamsDuplicateKey, len(s.stack))
	}
	i = jsonwalk.SkipSpace(b, end)
	if i >= len(b) || b[i] != ':' {
		return -1, nil
	}
	return jsonwalk.SkipSpace(b, i+1), nil
}

// seen records k as a key of the object top and reports whether it was
// already there: equal to one before it, or with fold, equal under case
// folding.
func (s *paramScan) seen(top *scanFrame, k []byte, fold bool) bool {
	if top.set != nil {
		name := setKey(k, fold)
		if _, ok := top.set[name]; ok {
			return true
		}
		top.set[name] = struct{}{}
		return false
	}
	mine := s.keys[top.keysAt:]
	for _, prev := range mine {
		// EqualFold stops at the first byte that differs by more than
		// case, the first one for most distinct keys.
		if fold && bytes.EqualFold(prev, k) || !fold && bytes.Equal(prev, k) {
			return true
		}
	}
	if len(mine) < keyListMax {
		s.keys = append(s.keys, k)
		return false
	}
	top.set = make(map[string]struct{}, 2*keyListMax)
	for _, prev := range mine {
		top.set[setKey(prev, fold)] = struct{}{}
	}
	top.set[setKey(k, fold)] = struct{}{}
	s.keys = s.keys[:top.keysAt]
	return false
}

// setKey is k as a scanFrame's set holds it: with fold, one spelling for
// all keys bytes.EqualFold finds equal (as encoding/json folds names):
// upper-case ASCII, and every other rune the least of its fold orbit.
func setKey(k []byte, fold bool) string {
	if !fold {
		return string(k)
	}
	out := make([]byte, 0, len(k))
	for i := 0; i < len(k); {
		if c := k[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(k[i:])
		for {
			// SimpleFold walks the orbit upwards and wraps to its least.
			next := unicode.SimpleFold(r)
			if next <= r {
				r = next
				break
			}
			r = next
		}
		out = utf8.AppendRune(out, r)
		i += n
	}
	return string(out)
}

func (s *paramScan) pop() {
	if top := s.stack[len(s.stack)-1]; top.obj {
		s.keys = s.keys[:top.keysAt]
	}
	s.stack = s.stack[:len(s.stack)-1]
}

// fail builds the error with the path through the first n open
// containers (each one's current member).
func (s *paramScan) fail(p ParamsProblem, n int) error {
	if p == ParamsTooDeep {
		n = min(n, 1) // the field the client set; the full path is noise
	}
	var path []byte
	for _, f := range s.stack[:n] {
		if len(path) >= maxPathBytes {
			path = append(path, "..."...)
			break
		}
		if !f.obj {
			path = append(path, '[')
			path = strconv.AppendInt(path, int64(f.index), 10)
			path = append(path, ']')
			continue
		}
		if len(path) > 0 {
			path = append(path, '.')
		}
		if len(f.key) > maxPathKeyBytes {
			path = append(path, f.key[:maxPathKeyBytes]...)
			path = append(path, "..."...)
		} else {
			path = append(path, f.key...)
		}
	}
	return &ParamsError{Problem: p, Path: string(path)}
}

// scanString returns the index just past the JSON string at b[i]=='"' and
// whether it holds a NUL: a raw zero byte or the escape \u0000.
func scanString(b []byte, i int) (end int, nul bool) {
	for i++; i < len(b); i++ {
		switch b[i] {
		case 0:
			nul = true
		case '\\':
			if i+5 < len(b) && b[i+1] == 'u' && string(b[i+2:i+6]) == "0000" {
				nul = true
			}
			i++
		case '"':
			return i + 1, nul
		}
	}
	return len(b), nul
}
