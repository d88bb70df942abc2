package pg

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Writes counts the statements a pool has run that may have changed data,
// so that a process which alone writes its schema can keep what it read
// until the next write (see WritesOf). It is raised after every statement
// that is not a successful SELECT (an INSERT, UPDATE or DELETE, with or
// without RETURNING; a COMMIT; anything that failed), batch and COPY: a
// transaction's changes are visible to other connections only after its
// COMMIT, and the count rises after that, before the call that ran it
// returns.
//
// A value read before a query and unchanged afterwards therefore says no
// write has ended in between: what the query returned is still what the
// database holds, to every caller whose own writes have returned. Being
// raised by statements that change nothing (BEGIN, an UPDATE of no row)
// only costs a query.
//
// One case escapes the count: a write that failed on the client's side (a
// deadline, a lost connection) has an unknown outcome. pgx closes the
// connection and asks the server to cancel the statement, but the server
// may run it on and commit it after the count rose (a COMMIT already
// flushing, a cancel request that arrives late, a COMMIT still on its
// way). Its backend is then unsure until the server shows it gone
// (Settled): pgx ends such a connection with a Terminate after whatever
// it sent, so a backend that has exited has done all it will. Nothing
// read may be kept meanwhile. A failure that leaves the connection open
// (nothing was sent, or the server answered) has a known outcome and is
// only counted.
type Writes struct {
	n atomic.Uint64

	mu        sync.Mutex
	unsure    map[uint32]uint64 // backends whose write failed on our side, and when (failures)
	failures  uint64
	nUnsure   atomic.Int32
	asking    bool // a Settled asks the server
	lastAsked time.Time
	questions atomic.Int64 // asked of the server (for tests)
	overflow  bool         // more unsure backends than maxUnsure: nothing is kept again
}

// maxUnsure bounds the backends Writes follows; settleEvery spaces the
// questions Settled asks the server.
const (
	maxUnsure   = 1024
	settleEvery = 20 * time.Millisecond
)

// Load returns the count.
func (w *Writes) Load() uint64 { return w.n.Load() }

func (w *Writes) wrote() { w.n.Add(1) }

// Failed records that a write on backend pid failed on the client's side,
// its outcome unknown until the backend is seen gone. The pool's tracer
// calls it; so may code that learns of such a write otherwise.
func (w *Writes) Failed(pid uint32) {
	w.mu.Lock()
	if w.unsure == nil {
		w.unsure = make(map[uint32]uint64)
	}
	w.failures++
	if _, ok := w.unsure[pid]; ok || len(w.unsure) < maxUnsure {
		w.unsure[pid] = w.failures
	} else {
		w.overflow = true
	}
	w.nUnsure.Store(int32(len(w.unsure)))
	w.mu.Unlock()
	w.wrote()
}

// Settled reports whether every write whose outcome the client could not
// see has ended on the server, asking the server (pg_stat_activity) when
// there are such writes: only then may a result be kept. When the last
// unsure backend is seen gone, the count rises once more, so that nothing
// read while it lived is taken for current.
//
// The server is asked at most once per settleEvery and by one caller at
// a time; the others are told no meanwhile (and read the database, as
// they would with nothing kept): a flood of reads while a backend is
// unsure adds a few queries a second, not one a read.
func (w *Writes) Settled(ctx context.Context, db *pgxpool.Pool) bool {
	if w.nUnsure.Load() == 0 {
		return true
	}
	w.mu.Lock()
	if w.overflow || w.asking || time.Since(w.lastAsked) < settleEvery {
		w.mu.Unlock()
		return false
	}
	w.asking, w.lastAsked = true, time.Now()
	w.questions.Add(1)
	defer func() {
		w.mu.Lock()
		w.asking = false
		w.mu.Unlock()
	}()
	pids := make([]int64, 0, len(w.unsure))
	for pid := range w.unsure {
		pids = append(pids, int64(pid))
	}
	asked := w.failures
	w.mu.Unlock()
	// Only a backend gone has surely ended the statement: one shown idle
	// may not have read it yet.
	rows, err := db.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)", pids)
	if err != nil {
		return false
	}
	alive, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return false
	}
	w.mu.Lock()
	for _, pid := range pids {
		// A backend that failed again since the question stays unsure.
		if at, ok := w.unsure[uint32(pid)]; ok && at <= asked && !slices.Contains(alive, int32(pid)) {
			delete(w.unsure, uint32(pid))
		}
	}
	left := len(w.unsure)
	if left == 0 {
		// Raised before the fast path above can see no unsure backend:
		// a result read while one ran carries an older count.
		w.wrote()
	}
	w.nUnsure.Store(int32(left))
	w.mu.Unlock()
	return left == 0
}

// WritesOf returns the count of a pool made by Open, or nil for any other
// pool (whose writes nobody counts: nothing read from it may be kept).
func WritesOf(pool *pgxpool.Pool) *Writes {
	if t, ok := pool.Config().ConnConfig.Tracer.(*writeTracer); ok {
		return t.w
	}
	return nil
}

// writeTracer raises a Writes count after each statement that may have
// written (pgx.QueryTracer, and BatchTracer and CopyFromTracer for those
// ways of writing), and refuses acquisitions while the pool's gate is
// closed (pgxpool.AcquireTracer; see Watch).
type writeTracer struct {
	w *Writes
	g *gate
}

// TraceAcquireStart fails the acquisition at once while Watch holds the
// database for gone, unless it is Watch's own ping; otherwise Watch may
// end it (gate.enter): waiting for a connection that a hung statement
// holds, or pinging or dialling a server that does not answer.
func (t *writeTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if t.g != nil && t.g.down.Load() && ctx.Value(watchPing{}) == nil {
		return notAskedContext{ctx}
	}
	return t.g.enter(ctx)
}

func (t *writeTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	t.g.leave(ctx)
}

// TraceQueryStart lets Watch end the statement (gate.enterStatement);
// the batch's and the copy's do the same.
func (t *writeTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return t.g.enterStatement(ctx, conn)
}

// TraceQueryEnd counts every statement but a successful SELECT. A read
// cut the same way as an unsure write is taken as one (the tracer does
// not see the SQL here): keeping waits until its backend has exited,
// moments after pgx closed the connection.
func (t *writeTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	t.g.leaveStatement(ctx, conn)
	switch {
	case d.Err == nil && d.CommandTag.Select():
	case unknownOutcome(conn, d.Err):
		t.w.Failed(conn.PgConn().PID())
	default:
		t.w.wrote()
	}
}

// unknownOutcome reports whether a statement that ended with err may
// still be run by the server: it failed on our side and pgx closed the
// connection (it keeps one whose exchange is whole: nothing was sent, or
// the server answered).
func unknownOutcome(conn *pgx.Conn, err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && !errors.As(err, &pgErr) && conn.IsClosed() && conn.PgConn().PID() != 0
}

func (t *writeTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return t.g.enterStatement(ctx, conn)
}

func (t *writeTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *writeTracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchEndData) {
	t.g.leaveStatement(ctx, conn)
	if unknownOutcome(conn, d.Err) {
		t.w.Failed(conn.PgConn().PID())
		return
	}
	t.w.wrote()
}

func (t *writeTracer) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return t.g.enterStatement(ctx, conn)
}

func (t *writeTracer) TraceCopyFromEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceCopyFromEndData) {
	t.g.leaveStatement(ctx, conn)
	if unknownOutcome(conn, d.Err) {
		t.w.Failed(conn.PgConn().PID())
		return
	}
	t.w.wrote()
}
