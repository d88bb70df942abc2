package pluginsandbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Bounds on what the sandbox keeps of one memory plugin's entries. A
// rebuild stores them all again, one call each, so they also bound how
// long a rebuild takes: 0.45 s for 10,000 entries, four of them 1 MiB
// (BenchmarkMemoryRebuild). A replica that finds the journal changed by
// another gives its instance only the changes (catchUp).
const (
	MaxMemoryEntries = 10000
	MaxMemoryBytes   = 16 << 20
)

// ledger is the sandbox's record of a memory plugin's entries: what the
// plugin answered success to, in order. A memory plugin keeps its state in
// its instance, and a limit or a trap stops the instance for good (seed
// 003): a recall of a few MiB spent kv's fuel, and the fresh instance the
// sandbox rebuilt was empty, every memory lost to one call. With the
// ledger the rebuilt instance is given its entries back, stored again in
// the order they were last stored, so a plugin that ranks by recency ranks
// as before.
//
// The lock is held across a guest call and the change it makes to the
// ledger, so the ledger's order is the plugin's; it is a channel so that a
// caller waiting for it stops with its context.
type ledger struct {
	lock    chan struct{}
	entries map[string]ledgerEntry // by key
	seq     uint64
	bytes   int
	// partial is set while a restore has not finished: one the plugin
	// refused an entry of leaves a live instance without the rest, which
	// the next call must not use as it is. A ledger handed over from an
	// earlier load of the plugin starts partial too.
	partial bool
	// moved is set once the entries went to a new load of the plugin: a
	// call that reached this one looks the plugin up again.
	moved bool
	// journal keeps the entries on disk; nil keeps them in memory only.
	journal *journal
}

type ledgerEntry struct {
	e    wasmhost.MemoryEntry
	seq  uint64
	size int
}

// errMemoryFull is a store refused at MaxMemoryEntries or MaxMemoryBytes.
var errMemoryFull = errors.New("memory plugin full")

func newLedger(j *journal) *ledger {
	return &ledger{lock: make(chan struct{}, 1), entries: map[string]ledgerEntry{}, journal: j}
}

// clone returns a copy of l's entries, with no journal.
func (l *ledger) clone() *ledger {
	c := newLedger(nil)
	c.entries, c.seq, c.bytes = maps.Clone(l.entries), l.seq, l.bytes
	return c
}

// inOrder returns the entries in the order they were last stored.
func (l *ledger) inOrder() []ledgerEntry {
	all := make([]ledgerEntry, 0, len(l.entries))
	for _, le := range l.entries {
		all = append(all, le)
	}
	slices.SortFunc(all, func(a, b ledgerEntry) int { return cmp.Compare(a.seq, b.seq) })
	return all
}

// record writes a change the plugin answered success to into the
// journal, if there is one.
func (l *ledger) record(r ...journalRecord) error {
	return l.recordChecked(nil, r...)
}

// recordStore is record of a store of e, which l holds already in place
// of prev (had: there was one). The bounds are checked again under the
// journal's lock when other replicas wrote to it since this one caught
// up: each checked against what it held, two replicas storing at once
// passed the bounds by one between them.
func (l *ledger) recordStore(e wasmhost.MemoryEntry, prev ledgerEntry, had bool) error {
	check := func(f *os.File, from int64) error {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		n := max(st.Size()-from, 0)
		if n > l.journal.limit {
			return fmt.Errorf("larger than %d bytes", l.journal.limit)
		}
		data := make([]byte, n)
		if _, err := f.ReadAt(data, from); err != nil {
			return err
		}
		data = data[:bytes.LastIndexByte(data, '\n')+1]
		now := newLedger(nil)
		if from > 0 {
			// l as it was before e, and what the others appended since.
			now = l.clone()
			now.forgot(e.Key)
			if had {
				now.entries[e.Key], now.bytes = prev, now.bytes+prev.size
			}
		}
		if err := replay(data, now); err != nil {
			return fmt.Errorf("from byte %d: %w", from, err)
		}
		return now.admit(e)
	}
	return l.recordChecked(check, storeRecord(e))
}

// recordChecked is record, with check run under the journal's lock on
// what other replicas wrote since this one read it.
func (l *ledger) recordChecked(check unreadCheck, r ...journalRecord) error {
	if l.journal == nil || len(r) == 0 {
		return nil
	}
	err := l.journal.appendChecked(check, r...)
	if errors.Is(err, fs.ErrNotExist) {
		// The memory folder was removed under the sandbox: every change
		// failed as "not written, retry" until the sandbox restarted,
		// and then came back empty. It is made again and given every
		// entry the ledger holds, this change's with them. Changes of
		// other replicas it takes into the ledger leave the instance
		// to a rebuild, which gives it them.
		var ops []journalRecord
		ops, err = l.journal.recreate(l, r...)
		if len(ops) > 0 {
			l.partial = true
		}
	}
	if errors.Is(err, errMemoryFull) {
		return err // refused, not a failure to write
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errNotRecorded, err)
	}
	return nil
}

func (l *ledger) acquire(ctx context.Context) error {
	select {
	case l.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *ledger) release() { <-l.lock }

// entrySize is what an entry counts against MaxMemoryBytes: the bytes of
// its strings.
func entrySize(e wasmhost.MemoryEntry) int {
	return len(e.Key) + len(e.Content) + len(e.Category) + len(e.SessionID)
}

// admit says why storing e would pass a bound, or nil.
func (l *ledger) admit(e wasmhost.MemoryEntry) error {
	old, replaces := l.entries[e.Key]
	if !replaces && len(l.entries) >= MaxMemoryEntries {
		return fmt.Errorf("%w: it holds %d entries, the limit; forget some first", errMemoryFull, len(l.entries))
	}
	if n := l.bytes - old.size + entrySize(e); n > MaxMemoryBytes {
		return fmt.Errorf("%w: its entries would be %d bytes, the limit is %d; forget some first", errMemoryFull, n, MaxMemoryBytes)
	}
	return nil
}

// stored records a store the plugin answered success to.
func (l *ledger) stored(e wasmhost.MemoryEntry) {
	l.forgot(e.Key)
	l.seq++
	size := entrySize(e)
	l.entries[e.Key] = ledgerEntry{e: e, seq: l.seq, size: size}
	l.bytes += size
}

// forgot records a forget.
func (l *ledger) forgot(key string) {
	if old, ok := l.entries[key]; ok {
		l.bytes -= old.size
		delete(l.entries, key)
	}
}

// restore rebuilds the plugin's instance and stores the ledger's entries
// in it again, oldest first. An entry the plugin refuses (it answered an
// error; its instance lives on) is dropped from the ledger and reported:
// a new version of the plugin may not accept what an old one did, and
// before, that one entry failed every later call with a rebuild and the
// same refusal. A store that stops the instance (a limit, a trap, the
// caller's deadline) leaves the ledger as it is and the restore
// unfinished: the next call restores again.
func (l *ledger) restore(ctx context.Context, m *wasmhost.Memory) (refused []refusal, err error) {
	l.partial = true
	if err := m.Rebuild(ctx); err != nil {
		return nil, err
	}
	all := l.inOrder()
	for i, le := range all {
		if restoreHook != nil {
			restoreHook(i)
		}
		// A caller gone between two stores leaves the instance alive with
		// the entries given so far: partial stays set, so the next call
		// restores again rather than answer from them.
		if err := ctx.Err(); err != nil {
			return refused, fmt.Errorf("store entry %d of %d again: %w", i+1, len(all), err)
		}
		err := m.Store(ctx, le.e)
		switch {
		case errors.Is(err, wasmhost.ErrPluginFailed):
			l.forgot(le.e.Key)
			refused = append(refused, refusal{key: le.e.Key, err: err})
		case err != nil:
			return refused, fmt.Errorf("store entry %d of %d again: %w", i+1, len(all), err)
		}
	}
	l.partial = false
	return refused, nil
}

// catchUp gives the instance the changes another replica made, records
// whose result l already holds, in order. One that fails leaves the
// instance to a rebuild (partial): it holds some of them.
func (l *ledger) catchUp(ctx context.Context, m *wasmhost.Memory, ops []journalRecord) error {
	for i, r := range ops {
		var err error
		if r.Op == opStore {
			err = m.Store(ctx, r.entry())
		} else {
			_, err = m.Forget(ctx, string(r.Key))
		}
		if err != nil {
			l.partial = true
			return fmt.Errorf("give the instance change %d of %d: %w", i+1, len(ops), err)
		}
	}
	return nil
}

// restoreHook, when set (by tests), is called before a restore stores its
// i-th entry.
var restoreHook func(i int)

// refusal is an entry a restore dropped because the plugin refused it.
type refusal struct {
	key string
	err error
}

// handOver gives a new load of a memory plugin (its folder changed, or
// the signature policy) the entries of the load it replaces, which were
// otherwise lost with the old instance; with a journal, those the new
// load read from it. Both ledgers
// are held until the catalog that names the new load is in place
// (release), so no call reaches either meanwhile: one already waiting on
// the old ledger finds it moved and looks the plugin up again, one on
// the new finds it partial and restores it first.
func handOver(ctx context.Context, from, to *ledger) (release func(), err error) {
	if err := from.acquire(ctx); err != nil {
		return nil, err
	}
	if err := to.acquire(ctx); err != nil {
		from.release()
		return nil, err
	}
	// A new load with a journal read it (memoryLedger): it holds every
	// change the old load recorded, and the journal gives it those made
	// since. Laid over it, the old load's entries brought back those
	// other replicas forgot since the old load last read the journal.
	if to.journal == nil {
		for k, le := range from.entries {
			to.entries[k] = le
		}
		to.seq, to.bytes = from.seq, from.bytes
		to.partial = len(to.entries) > 0
	}
	from.entries, from.bytes, from.moved = map[string]ledgerEntry{}, 0, true
	return func() { to.release(); from.release() }, nil
}
