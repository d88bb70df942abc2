package pg

import (
	"context"
	"fmt"
)

// errGivenUp is what an acquisition or a statement in flight fails with
// once Watch has seen the database gone (see gate.strike).
var errGivenUp = fmt.Errorf("%w (given up: it did not answer the last check)", ErrUnavailable)

// inFlight is the context of one acquisition or statement on a watched
// pool: the caller's, and done besides once Watch sees the database
// gone, with errGivenUp for its error. Before, the gate refused only
// the calls made after: one already waiting on a server that did not
// answer (a SIGSTOPped host) waited its caller's whole deadline, 10 s,
// while health said the database was gone.
type inFlight struct {
	context.Context
	cancel context.CancelCauseFunc
}

// Err is errGivenUp when Watch ended the call: pgx and the pool return
// it (an acquisition) or a timeout of the connection it cut (a
// statement), both of which read as unavailable (IsUnavailable), not as
// the caller's own cancellation.
func (c *inFlight) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == errGivenUp {
		return errGivenUp
	}
	return err
}

// enter returns the context for one acquisition or statement made with
// ctx, which leave must be given once it ended. Unwatched pools (no
// Watch would strike) pay nothing.
func (g *gate) enter(ctx context.Context) context.Context {
	if g == nil || g.watchers.Load() == 0 {
		return ctx
	}
	cctx, cancel := context.WithCancelCause(ctx)
	c := &inFlight{Context: cctx, cancel: cancel}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone {
		// Begun after the strike, on a connection already held (a
		// transaction's next statement): it would wait the same way.
		cancel(errGivenUp)
		return c
	}
	if g.calls == nil {
		g.calls = make(map[*inFlight]struct{})
	}
	g.calls[c] = struct{}{}
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
	// Releases the caller's context of it.
	c.cancel(nil)
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
		c.cancel(errGivenUp)
		delete(g.calls, c)
	}
}

// clear lets statements begin again: Watch's ping was answered.
func (g *gate) clear() {
	g.mu.Lock()
	g.gone = false
	g.mu.Unlock()
}
