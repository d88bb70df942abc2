package session

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/clawmesh/clawmesh/internal/pg"
)

// kept holds the results of the store's two most frequent reads, the open
// sessions (Status, polled by every client) and one session's row
// (State), until a write to the schema ends: a read answered from them is
// what the database would have returned, without the round trip.
//
// This holds because this process is the only writer of its schema (one
// session service runs per stack; its live turns already assume it) and
// pg.Writes rises after every statement that may have written, before the
// call that ran it returns. A result is kept with the count read before
// its query began, and used only while the count is still that: no write
// has ended since the query began, so a caller whose own write returned
// before it asked always sees that write. Nothing is kept, nor used,
// while a write that failed on our side may still be running on the
// server (pg.Writes.Settled), nor without a count (a pool not made by
// pg.Open).
type kept struct {
	writes *pg.Writes

	open atomic.Pointer[keptOpen]

	mu     sync.Mutex
	rowsAt uint64 // the count rows were read at
	rows   map[string]sessionRow

	queries atomic.Int64 // reads that went to the database (for tests)
}

type keptOpen struct {
	at   uint64
	open []openSession
}

// maxKeptRows bounds the session rows kept between two writes.
const maxKeptRows = 1024

// openSessionsNow returns the open sessions when no write has ended since
// they were last read.
func (st *store) openSessionsNow(ctx context.Context) ([]openSession, bool) {
	w := st.kept.writes
	if w == nil || !w.Settled(ctx, st.db) {
		return nil, false
	}
	o := st.kept.open.Load()
	if o == nil || o.at != w.Load() {
		return nil, false
	}
	return o.open, true
}

// openSessionsKeeping reads the open sessions and keeps them for
// openSessionsNow.
func (st *store) openSessionsKeeping(ctx context.Context) ([]openSession, error) {
	w := st.kept.writes
	keep := w != nil && w.Settled(ctx, st.db)
	var at uint64
	if keep {
		at = w.Load()
	}
	st.kept.queries.Add(1)
	open, err := st.openSessions(ctx)
	if err == nil && keep {
		st.kept.open.Store(&keptOpen{at: at, open: open})
	}
	return open, err
}

// sessionKept is session, answered from a row read since the last write
// ended when there is one. The row is shared: read-only.
func (st *store) sessionKept(ctx context.Context, id string) (sessionRow, error) {
	w := st.kept.writes
	if w == nil || !w.Settled(ctx, st.db) {
		st.kept.queries.Add(1)
		return st.session(ctx, id)
	}
	at := w.Load()
	st.kept.mu.Lock()
	r, ok := st.kept.rows[id]
	ok = ok && st.kept.rowsAt == at
	st.kept.mu.Unlock()
	if ok {
		return r, nil
	}
	st.kept.queries.Add(1)
	r, err := st.session(ctx, id)
	if err != nil {
		return r, err
	}
	st.kept.mu.Lock()
	defer st.kept.mu.Unlock()
	switch {
	case st.kept.rows == nil || at > st.kept.rowsAt:
		// The rows kept so far were read before a write: gone.
		if st.kept.rows == nil {
			st.kept.rows = make(map[string]sessionRow)
		}
		clear(st.kept.rows)
		st.kept.rowsAt = at
	case at < st.kept.rowsAt:
		return r, nil // read before a write newer rows were read after
	}
	if len(st.kept.rows) < maxKeptRows {
		st.kept.rows[id] = r
	}
	return r, nil
}
