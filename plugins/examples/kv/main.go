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
// search over all of it spends 0.38 x 10^9 at most, and the answer the
// guest library keeps to abi.RecallAnswerBytes up to 0.35 more (maxBytes
// was chosen when the fuel meter charged Go's dispatch blocks, at 0.72).
// Under a lower call_fuel a recall answers with what its fuel covers
// (Recall).
package main

import (
	"errors"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

type kv struct{}

type stored struct {
	e            memory.Entry
	key, content string // lowered
}

// maxBytes bounds the keys and contents kv holds (a variable so that the
// sandbox's tests can take it away).
var maxBytes = 6 << 20

var (
	entries = map[string]*stored{}
	// recent holds the entries in the order they were stored, the newest
	// last, so that a recall searches newest first and stops once it has
	// its answer. A replaced or forgotten entry stays until more than half
	// are (compact); an entry is live while entries holds it (live).
	recent []*stored
	held   int // bytes of keys and contents
)

// What a recall may spend, in fuel, checked against what its call has
// left: searchUnitsPerByte a byte of key and content searched (the
// finder's costliest query measured about 61), answerUnitsPerByte a byte
// of key and content the guest library encodes into the answer (measured
// 10.5 for plain text, 45 to 52 for text that is not ASCII, 263 for
// control characters, each six bytes of JSON), and recallReserve for the
// rest of the call. Under the default call_fuel (10^9) the whole of what
// kv holds and a whole answer fit: 6 MiB searched and 1 MiB answered are
// 0.70 x 10^9 by these figures.
const (
	searchUnitsPerByte = 64
	answerUnitsPerByte = 288
	recallReserve      = 1 << 20
)

func (kv) Name() string                      { return "kv" }
func (kv) Capabilities() memory.Capabilities { return memory.Capabilities{Count: true} }

func (kv) Store(e memory.Entry) error {
	n := held + len(e.Key) + len(e.Content)
	old, replaces := entries[e.Key]
	if replaces {
		n -= len(old.e.Key) + len(old.e.Content)
	}
	if n > maxBytes {
		return fmt.Errorf("kv holds at most %d bytes of keys and contents; forget some first", maxBytes)
	}
	held = n
	s := &stored{e: e, key: lower(e.Key), content: lower(e.Content)}
	entries[e.Key] = s
	recent = append(recent, s)
	compact()
	return nil
}

// Recall searches newest first and stops at limit matches, or once the
// matches fill an answer (the guest library keeps an answer to
// abi.RecallAnswerBytes). Before it searches an entry, and before it takes
// one into the answer, it checks that the call's fuel covers that and the
// answer so far. When it does not (a call_fuel set lower than what kv
// holds needs), it answers with what it has found: the newest matches,
// ahead of any in the older entries it did not search, as an answer cut
// at its size is; or, having found none, fails with an error of its own.
// Running out of fuel instead would stop the instance and have the sandbox
// rebuild it, every entry stored again, only to fail the same way.
func (kv) Recall(query string, limit int) ([]memory.Entry, error) {
	q := newFinder(lower(query))
	var out []memory.Entry
	answer, searched := 0, 0
	for i := len(recent) - 1; i >= 0; i-- {
		s := recent[i]
		if !live(s) {
			continue
		}
		size := len(s.key) + len(s.content)
		if !affords(searchUnitsPerByte*size + answerUnitsPerByte*answer) {
			return cut(out, searched)
		}
		searched++
		if !q.in(s.key) && !q.in(s.content) {
			continue
		}
		next := min(answer+size, abi.RecallAnswerBytes+1)
		if !affords(answerUnitsPerByte * next) {
			return cut(out, searched)
		}
		out, answer = append(out, s.e), next
		if (limit > 0 && len(out) == limit) || answer > abi.RecallAnswerBytes {
			break // the answer is whole: its JSON is never shorter than its strings
		}
	}
	return out, nil
}

// affords reports whether the call's fuel covers units more and the
// reserve.
func affords(units int) bool { return pdk.FuelLeft() >= int64(units)+recallReserve }

// cut ends a recall its fuel does not cover after searched entries.
func cut(out []memory.Entry, searched int) ([]memory.Entry, error) {
	msg := fmt.Sprintf("recall cut after the newest %d of %d entries: searching and answering what kv holds needs more fuel than a call is given (plugins.limits.call_fuel); forget some entries or raise it",
		searched, len(entries))
	if len(out) == 0 {
		return nil, errors.New(msg)
	}
	pdk.Log(pdk.LevelWarn, pdk.Event{Action: "recall", Outcome: "success", Message: msg})
	return out, nil
}

func (kv) Forget(key string) (bool, error) {
	old, ok := entries[key]
	if !ok {
		return false, nil
	}
	held -= len(old.e.Key) + len(old.e.Content)
	delete(entries, key)
	compact()
	return true, nil
}

// live reports whether s is its key's entry, not one replaced or
// forgotten since.
func live(s *stored) bool { return entries[s.e.Key] == s }

// compact drops the entries no longer live from recent once they are
// more than half of it: each store or forget pays for it once, on
// average.
func compact() {
	if len(recent) <= 2*len(entries) {
		return
	}
	kept := recent[:0]
	for _, s := range recent {
		if live(s) {
			kept = append(kept, s)
		}
	}
	clear(recent[len(kept):])
	recent = kept
}

func (kv) Count() (int, error) { return len(entries), nil }

func init() { memory.Register(kv{}) }

func main() {}
