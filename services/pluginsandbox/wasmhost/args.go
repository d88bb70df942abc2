package wasmhost

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/clawmesh/clawmesh/internal/jsonwalk"
)

// configArg is the argument member the host owns: what a caller sends
// under it is dropped, and the plugin's validated public config, if any,
// goes there instead.
const configArg = "__config"

// toolArgs holds a tool call's argument object, read. What the guest
// receives (with) is that object without a caller's "__config", with the
// plugin's public config under that key when it has one, keys sorted,
// the last of duplicate keys kept, no insignificant space: the bytes
// encoding/json writes for the map[string]json.RawMessage the arguments
// decode into, which is how the host first built them and still builds
// some (byMap). FuzzToolArgs holds both ways to the same bytes.
//
// Most arguments take the shorter way, a compaction and a split of the
// object's top level: decoding and encoding again with encoding/json
// cost a call 15 to 20 µs on the cold caches calls run on, a fifth of a
// call into a guest without a runtime (docs/performance.md, "Fourteenth
// round"). Arguments with a key that is not plain ASCII without escapes,
// or with a character encoding/json escapes for HTML anywhere, go by the
// map, so that such keys are never read two ways.
type toolArgs struct {
	members []member                   // the short way
	byMap   map[string]json.RawMessage // the long way, when not nil
	size    int                        // the compact object's length
}

// errArgsNotObject is the error of arguments that are not a JSON object.
var errArgsNotObject = fmt.Errorf("%w: arguments must be a JSON object", ErrABI)

// readToolArgs reads a call's arguments, a JSON object (none is {}).
func readToolArgs(raw json.RawMessage) (toolArgs, error) {
	if len(raw) == 0 {
		return toolArgs{size: 2}, nil
	}
	if bytes.ContainsAny(raw, "<>&\u2028\u2029") {
		return readArgsByMap(raw)
	}
	var c bytes.Buffer
	c.Grow(len(raw))
	if err := json.Compact(&c, raw); err != nil || c.Bytes()[0] != '{' {
		return toolArgs{}, errArgsNotObject
	}
	members, ok := objectMembers(c.Bytes())
	if !ok {
		return readArgsByMap(raw)
	}
	return toolArgs{members: members, size: c.Len()}, nil
}

func readArgsByMap(raw json.RawMessage) (toolArgs, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return toolArgs{}, errArgsNotObject
	}
	return toolArgs{byMap: m}, nil
}

// with returns the bytes the guest receives, config (JSON, or nil for
// none) under "__config".
func (a toolArgs) with(config json.RawMessage) ([]byte, error) {
	if a.byMap != nil {
		delete(a.byMap, configArg)
		if config != nil {
			a.byMap[configArg] = config
		}
		out, err := json.Marshal(a.byMap)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrABI, err)
		}
		return out, nil
	}
	members := slices.DeleteFunc(a.members, func(m member) bool { return m.key == configArg })
	if config != nil {
		members = append(members, member{configArg, config})
	}
	// Sorted by key, the last of equal keys last of its run (a stable
	// sort), so that it is the one kept.
	slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out := make([]byte, 0, a.size+len(config)+len(configArg)+4)
	out = append(out, '{')
	for i, m := range members {
		if i+1 < len(members) && members[i+1].key == m.key {
			continue // a later duplicate replaces it
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, m.key...)
		out = append(out, '"', ':')
		out = append(out, m.value...)
	}
	return append(out, '}'), nil
}

// member is one member of a JSON object: its key as written (no escape,
// see objectMembers) and its value's bytes.
type member struct {
	key   string
	value []byte
}

// objectMembers splits c, a compact JSON object (json.Compact's output:
// valid, no space outside strings), into its members. ok is false when a
// key holds a byte other than printable ASCII or a backslash: its
// decoded form would differ from its bytes.
func objectMembers(c []byte) (members []member, ok bool) {
	for key, val, i, more := jsonwalk.NextMember(c, 1); more; key, val, i, more = jsonwalk.NextMember(c, i) {
		name := key[1 : len(key)-1] // the quotes off
		for _, b := range name {
			if b == '\\' || b < 0x20 || b >= 0x7f {
				return nil, false
			}
		}
		members = append(members, member{string(name), val})
	}
	return members, true
}
