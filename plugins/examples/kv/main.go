//go:build wasip1

// Command kv is an example memory plugin: entries live in the instance (the
// memory world has no file, network or config import), recalled by a
// case-insensitive substring match on key or content, newest first.
package main

import (
	"sort"
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

type kv struct{}

var (
	entries = map[string]memory.Entry{}
	order   = map[string]int{}
	clock   int
)

func (kv) Name() string                      { return "kv" }
func (kv) Capabilities() memory.Capabilities { return memory.Capabilities{Count: true} }

func (kv) Store(e memory.Entry) error {
	clock++
	entries[e.Key], order[e.Key] = e, clock
	return nil
}

func (kv) Recall(query string, limit int) ([]memory.Entry, error) {
	q := strings.ToLower(query)
	var out []memory.Entry
	for k, e := range entries {
		if strings.Contains(strings.ToLower(k), q) || strings.Contains(strings.ToLower(e.Content), q) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return order[out[i].Key] > order[out[j].Key] })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (kv) Forget(key string) (bool, error) {
	_, ok := entries[key]
	delete(entries, key)
	delete(order, key)
	return ok, nil
}

func (kv) Count() (int, error) { return len(entries), nil }

func init() { memory.Register(kv{}) }

func main() {}
