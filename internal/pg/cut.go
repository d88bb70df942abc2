package pg

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// A statement Watch ends (gate.strike) is ended the way pgx ends any
// cancelled one: a deadline of now on its connection (strike sets it on
// a statement's connection, pgx on an acquisition's ping when its
// context, gate.enter's, is done: cutWatcher). pgx then
// reports the read or write that deadline broke, "timeout: i/o timeout",
// and each service logged the call so, as if it had merely run out of
// time, though the database had been seen gone. The connection of a
// watched pool says instead what ended it: errGivenUp, an ErrUnavailable,
// mapped here once for every statement.

// cutConn is a watched pool's connection: once its statement is cut by
// Watch, the deadline's errors read as errGivenUp.
type cutConn struct {
	net.Conn
	cut atomic.Bool
}

func (c *cutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, c.explain(err)
}

func (c *cutConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, c.explain(err)
}

func (c *cutConn) explain(err error) error {
	if err != nil && c.cut.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
		return &cutError{deadline: err}
	}
	return err
}

// cutError is a read or write broken by the deadline that ended a
// statement Watch cut. It is not a timeout to pgx (no Timeout method):
// pgx closes the connection at once, as it must (the exchange was cut
// in the middle), and reports this error as it is, not as "timeout:".
type cutError struct{ deadline error }

func (e *cutError) Error() string   { return errGivenUp.Error() }
func (e *cutError) Unwrap() []error { return []error{errGivenUp, e.deadline} }

// cutWatcher is pgx's context handler on a cutConn: the deadline of
// pgx's own (pgconn.DeadlineContextWatcherHandler), marking the
// connection cut when Watch is what ended the statement.
type cutWatcher struct {
	conn *cutConn
	pgconn.DeadlineContextWatcherHandler
}

func (h *cutWatcher) HandleCancel(ctx context.Context) {
	// The statement's context (gate.enter's), or one made from it.
	if errors.Is(ctx.Err(), errGivenUp) || errors.Is(context.Cause(ctx), errGivenUp) {
		h.conn.cut.Store(true)
	}
	h.DeadlineContextWatcherHandler.HandleCancel(ctx)
}

func (h *cutWatcher) HandleUnwatchAfterCancel() {
	h.DeadlineContextWatcherHandler.HandleUnwatchAfterCancel()
	h.conn.cut.Store(false)
}

// explainCuts makes cfg's connections say errGivenUp for a statement
// Watch cut (see cutConn).
func explainCuts(cfg *pgconn.Config) {
	after := cfg.AfterNetConnect
	cfg.AfterNetConnect = func(ctx context.Context, c *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if after != nil {
			var err error
			if conn, err = after(ctx, c, conn); err != nil {
				return nil, err
			}
		}
		return &cutConn{Conn: conn}, nil
	}
	build := cfg.BuildContextWatcherHandler
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		c, ok := pc.Conn().(*cutConn)
		if !ok {
			return build(pc)
		}
		return &cutWatcher{conn: c, DeadlineContextWatcherHandler: pgconn.DeadlineContextWatcherHandler{Conn: c}}
	}
}
