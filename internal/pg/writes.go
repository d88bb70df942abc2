package pg

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
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
type Writes struct{ n atomic.Uint64 }

// Load returns the count.
func (w *Writes) Load() uint64 { return w.n.Load() }

func (w *Writes) wrote() { w.n.Add(1) }

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
// ways of writing).
type writeTracer struct{ w *Writes }

func (t *writeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *writeTracer) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err != nil || !d.CommandTag.Select() {
		t.w.wrote()
	}
}

func (t *writeTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t *writeTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *writeTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) { t.w.wrote() }

func (t *writeTracer) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return ctx
}

func (t *writeTracer) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {
	t.w.wrote()
}
