//go:build wasip1

// Command kv is an example memory plugin: entries live in the instance (the
// memory world has no file, network or config import), recalled by a
// case-insensitive substring match on key or content, newest first.
//
// Everything a recall and a store do is paid in fuel (10^9 units a call by
// default, about a wasm instruction each), and Go compiled to wasm spends
// many a byte. Lowering every entry at every recall would spend 0.05 to
// 0.14 x 10^9 a MiB, matching or not, so each entry keeps its key and
// content lowered, made once when it is stored by lower (lower.go: a store
// of 1 MiB costs 0.06 x 10^9 of ASCII, about 0.1 of accented, Greek or
// Cyrillic text, 0.17 of Japanese). A recall searches with finder
// (find.go), linear whatever the query, and kv holds at most maxBytes: a
// recall over all of it spends 0.38 x 10^9 at most, the answer the guest
// library keeps to abi.RecallAnswerBytes included (maxBytes was chosen
// when the fuel meter charged Go's dispatch blocks, at 0.72).
package main

import (
	"fmt"
	"sort"

	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

type kv struct{}

type stored struct {
	e            memory.Entry
	key, content string // lowered
	order        int
}

// maxBytes bounds the keys and contents kv holds (a variable so that the
// sandbox's tests can take it away).
var maxBytes = 6 << 20

var (
	entries = map[string]stored{}
	held    int // bytes of keys and contents
	clock   int
)

func (kv) Name() string                      { return "kv" }
func (kv) Capabilities() memory.Capabilities { return memory.Capabilities{Count: true} }

func (kv) Store(e memory.Entry) error {
	n := held + len(e.Key) + len(e.Content)
	if old, ok := entries[e.Key]; ok {
		n -= len(old.e.Key) + len(old.e.Content)
	}
	if n > maxBytes {
		return fmt.Errorf("kv holds at most %d bytes of keys and contents; forget some first", maxBytes)
	}
	held = n
	clock++
	entries[e.Key] = stored{e: e, key: lower(e.Key), content: lower(e.Content), order: clock}
	return nil
}

func (kv) Recall(query string, limit int) ([]memory.Entry, error) {
	q := newFinder(lower(query))
	var found []stored
	for _, s := range entries {
		if q.in(s.key) || q.in(s.content) {
			found = append(found, s)
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].order > found[j].order })
	if limit > 0 && len(found) > limit {
		found = found[:limit]
	}
	out := make([]memory.Entry, len(found))
	for i, s := range found {
		out[i] = s.e
	}
	return out, nil
}

func (kv) Forget(key string) (bool, error) {
	old, ok := entries[key]
	held -= len(old.e.Key) + len(old.e.Content)
	delete(entries, key)
	return ok, nil
}

func (kv) Count() (int, error) { return len(entries), nil }

func init() { memory.Register(kv{}) }

func main() {}
