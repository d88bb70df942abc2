package pg

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// errGivenUp is what an acquisition or a statement in flight fails with
// once Watch has seen the database gone (see gate.strike).
var errGivenUp = fmt.Errorf("%w (given up: it did not answer the last check)", ErrUnavailable)

// inFlight is the context of one acquisition on a watched pool: the
// caller's, and done besides once Watch sees the database gone, with
// errGivenUp for its error. Before, the gate refused only the calls made
// after: one already waiting on a server that did not answer (a
// SIGSTOPped host) waited its caller's whole deadline, 10 s, while
// health said the database was gone.
//
// It is a context of its own, kept for the next acquisition (inFlights)
// when it ended undone: a cancel context made for each cost 4
// allocations (the context, its cancel func, its Done channel, the
// wrapper for Err). One kept costs none, or AfterFunc's two when the
// caller's context can be done.
type inFlight struct {
	parent context.Context
	done   chan struct{} // closed once, by end: never reused after
	stop   func() bool   // AfterFunc's on parent, nil when parent cannot be done
	// onParent is c.parentDone, made once with c.
	onParent func()

	mu  sync.Mutex
	err error // set as done is closed
}

// inFlights keeps the inFlights that ended undone. One that ended done
// is not kept: the pool may still be waiting on it (the constructor
// goroutine of a connection its caller gave up on).
var inFlights = sync.Pool{New: func() any {
	c := &inFlight{done: make(chan struct{})}
	c.onParent = c.parentDone
	return c
}}

func (c *inFlight) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *inFlight) Done() <-chan struct{}       { return c.done }
func (c *inFlight) Value(key any) any           { return c.parent.Value(key) }

// Err is errGivenUp when Watch ended the call: the pool returns it, which
// reads as unavailable (IsUnavailable), not as the caller's own
// cancellation; the caller's error when its context ended it.
func (c *inFlight) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *inFlight) parentDone() { c.end(c.parent.Err()) }

// end makes c done with err, unless it is already.
func (c *inFlight) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// givenUpContext is done from the start, errGivenUp its error: what a
// call begun after the strike runs on.
type givenUpContext struct{ context.Context }

func (givenUpContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (givenUpContext) Done() <-chan struct{}       { return closedDone }
func (givenUpContext) Err() error                  { return errGivenUp }

// enter returns the context for one acquisition made with ctx, which
// leave must be given once it ended. Unwatched pools (no Watch would
// strike) pay nothing.
//
// An acquisition needs a context of its own: the pool waits for a
// connection, dials one or pings an idle one on nothing but the
// context's Done. A statement does not (enterStatement).
func (g *gate) enter(ctx context.Context) context.Context {
	if g == nil || g.watchers.Load() == 0 {
		return ctx
	}
	g.mu.Lock()
	if g.gone {
		g.mu.Unlock()
		return givenUpContext{ctx}
	}
	c := inFlights.Get().(*inFlight)
	c.parent = ctx
	if g.calls == nil {
		g.calls = make(map[*inFlight]struct{})
	}
	g.calls[c] = struct{}{}
	g.mu.Unlock()
	if ctx.Done() != nil {
		c.stop = context.AfterFunc(ctx, c.onParent)
		if err := ctx.Err(); err != nil {
			// Done already: AfterFunc runs onParent on a goroutine of
			// its own, maybe after the pool took an idle connection.
			c.end(err)
		}
	}
	return c
}

// leave ends what enter began with the context enter returned.
func (g *gate) leave(ctx context.Context) {
	c, ok := ctx.(*inFlight)
	if !ok {
		return
	}
	g.mu.Lock()
	delete(g.calls, c)
	g.mu.Unlock()
	// Releases the caller's context of it; false: onParent ran, or
	// runs.
	stopped := c.stop == nil || c.stop()
	c.mu.Lock()
	undone := c.err == nil
	c.mu.Unlock()
	if stopped && undone {
		c.parent, c.stop = nil, nil
		inFlights.Put(c)
	}
}

// statement is a connection with statements in flight (gate.stmts).
type statement struct {
	nc     net.Conn // the connection's socket, which strike cuts
	n      int32    // statements begun and not ended: a second one on a busy connection fails, but is traced
	struck bool
}

// enterStatement lets Watch end the statement conn is about to run, and
// returns the context to run it on (ctx itself, or one already done
// with errGivenUp once the database is seen gone); leaveStatement must
// be given it once the statement ended.
//
// A statement is ended by its connection, not by its context: strike
// sets the socket's deadline to now, as pgx itself does when a
// statement's context is done (DeadlineContextWatcherHandler), and pgx
// closes the connection the read or write failed on. A context of its
// own for each statement (a cancel context, its cancel func and Done
// channel, our wrapper, and the map pgx's context watch registers in on
// that new context rather than the caller's) cost 6 of the 10
// allocations, about 490 B, Watch added to a pool.Exec made with a
// deadline; the connection costs none.
func (g *gate) enterStatement(ctx context.Context, conn *pgx.Conn) context.Context {
	if g == nil || g.watchers.Load() == 0 {
		return ctx
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone {
		// Begun after the strike, on a connection already held (a
		// transaction's next statement): it would wait the same way.
		return givenUpContext{ctx}
	}
	if g.stmts == nil {
		// As many as the pool's connections (a connection runs one
		// statement at a time), each until its statement ends.
		g.stmts = make(map[*pgx.Conn]statement)
	}
	s := g.stmts[conn]
	if s.n == 0 {
		s = statement{nc: conn.PgConn().Conn()}
	}
	s.n++
	g.stmts[conn] = s
	g.nStmts.Add(1)
	return ctx
}

// leaveStatement ends what enterStatement began.
func (g *gate) leaveStatement(ctx context.Context, conn *pgx.Conn) {
	if g == nil || g.nStmts.Load() == 0 {
		// Nothing registered, this statement's registration included.
		return
	}
	if _, ok := ctx.(givenUpContext); ok {
		return
	}
	g.mu.Lock()
	s, ok := g.stmts[conn]
	if !ok {
		// Begun before Watch started.
		g.mu.Unlock()
		return
	}
	g.nStmts.Add(-1)
	if s.n--; s.n > 0 {
		g.stmts[conn] = s
		g.mu.Unlock()
		return
	}
	delete(g.stmts, conn)
	g.mu.Unlock()
	if s.struck && !conn.IsClosed() {
		// The statement ended before the deadline cut it: the
		// connection is whole, and would fail its next statement at
		// once (pgx clears its own deadline the same way).
		_ = s.nc.SetDeadline(time.Time{})
		if c, ok := s.nc.(*cutConn); ok {
			c.cut.Store(false)
		}
	}
}

// strike ends every acquisition and statement in flight, and those
// begun until clear: Watch's own ping found the database gone. A
// statement ended so has its connection closed by pgx (the server rolls
// back an open transaction when it reads the close; a COMMIT already
// sent has an unknown outcome, as at any deadline, and Writes counts it
// so). Only Watch strikes: a call that found the database gone
// (MarkUnavailable) may have lost one backend of a server that answers
// the others.
func (g *gate) strike() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gone = true
	for c := range g.calls {
		c.end(errGivenUp)
		delete(g.calls, c)
	}
	now := time.Now()
	for conn, s := range g.stmts {
		if !s.struck {
			s.struck = true
			g.stmts[conn] = s
			if c, ok := s.nc.(*cutConn); ok {
				// Its errors say the database was seen gone, not
				// "i/o timeout" (cut.go).
				c.cut.Store(true)
			}
			_ = s.nc.SetDeadline(now)
		}
	}
}

// clear lets statements begin again: Watch's ping was answered.
func (g *gate) clear() {
	g.mu.Lock()
	g.gone = false
	g.mu.Unlock()
}
