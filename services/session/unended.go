package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// A turn's end is written in one transaction with its last checkpoint
// events (finish). When that write fails (past the unwind bound: the
// database slow, the turn's row locked), the process has ended the turn
// all the same and published its turn_complete; the store still reads it
// running. What the write would have written is kept (turnEnd) in memory,
// within maxUnendedBytes for the process, and in the spool on the local
// disk (endspool.go), written before the turn_complete goes out, and
// written at the session's next admission, its eviction from memory, the
// service's shutdown or, after a crash, the next start, so that the store
// ends the turn as its clients were told: the same outcome, stop reason
// and reply, its last events. Recording it as recovery records a turn
// (cancelled, interrupted, the events the writer had stored) made a
// completed turn read back cancelled and its last chunks missing from
// session/load and the bridge's replay, and the next start told its
// clients a second end. Only an end neither kept in memory nor spooled
// (both bounds reached, or the spool's write failed and the process died)
// is left to that, with a log of what its clients were told.
//
// A session holds at most one end not written: its next admission writes
// it before a turn starts, or is refused.

// maxUnendedBytes bounds what the process keeps in memory of ends not
// written, all sessions together: a turn's reply may be megabytes
// (MaxReplyBytes), and a database that refuses every end would otherwise
// keep each of them. Past it an end is kept in the spool alone.
const maxUnendedBytes = 64 << 20

// turnEnd is what a turn's end writes after its last checkpoint events.
type turnEnd struct {
	sessionID, turnID string
	res               turnResult
	// said is the turn's text the transcript lacks (its last steps').
	said      string
	published *int64
	// unrecorded are the asks whose decision could not be stored
	// (turn.unrecorded).
	unrecorded []string
	// updateMap is turns.update_map; mapped once it was taken from the
	// turn's log (turn.endMap takes the marks it holds).
	updateMap []int64
	mapped    bool
	// events are the checkpoint events the failed write carried, kept
	// once it failed.
	events []cpEvent
}

// writeTx writes e after the turn's events, in their transaction.
func (e *turnEnd) writeTx(ctx context.Context, tx pgx.Tx) error {
	if e.res.Outcome == OutcomeFailed {
		// What it streamed before it failed stays, as a cancelled or
		// interrupted turn's does: its followers saw it and the
		// provider is given it (the checkpoint holds it), so the
		// transcript shows it too.
		if e.said != "" {
			if _, err := appendMessageTx(ctx, tx, e.sessionID, e.turnID, roleAssistant, e.said); err != nil {
				return err
			}
		}
		if _, err := appendMessageTx(ctx, tx, e.sessionID, e.turnID, roleSystem, "Turn failed: "+e.res.Error); err != nil {
			return err
		}
	} else if e.said != "" {
		// The text of the steps that asked for tools is in the
		// transcript already, before their tool rows.
		if _, err := appendMessageTx(ctx, tx, e.sessionID, e.turnID, roleAssistant, e.said); err != nil {
			return err
		}
	}
	if len(e.unrecorded) > 0 {
		// A decision write reported failed may have committed (its
		// answer lost): the call did not run on it.
		if _, err := tx.Exec(ctx, "UPDATE approvals SET status = 'cancelled' WHERE request_id = ANY($1) AND session_id = $2", e.unrecorded, e.sessionID); err != nil {
			return err
		}
	}
	return finishTurnTx(ctx, tx, e.sessionID, e.turnID, e.res, e.published, e.updateMap)
}

// size is about what keeping e holds.
func (e *turnEnd) size() int64 {
	n := len(e.res.Content) + len(e.res.Error) + len(e.res.Said) + len(e.said) + 8*len(e.updateMap)
	for _, ev := range e.events {
		n += len(ev.Content) + len(ev.Marks) + 128
	}
	for _, id := range e.unrecorded {
		n += len(id)
	}
	return int64(n)
}

// unendedTurn is a turn of liveSession.unended: its end, or nil when it
// was not kept in memory (past maxUnendedBytes); spooled, its end is in
// the spool too. Neither, the turn is ended as recovery ends one.
type unendedTurn struct {
	id      string
	end     *turnEnd
	spooled bool
	// told is what its clients were told, for the log of an end lost.
	told turnResult
}

// spoolEnd writes end to the spool and reports whether it did; ls.mu is
// not held (the write is synced).
func (s *Server) spoolEnd(end *turnEnd) bool {
	if err := s.spool.put(end); err != nil {
		s.log.Warn("turn end not spooled: a crash before it is written records it as recovery does", zap.String("session_id", end.sessionID),
			zap.String("turn_id", end.turnID), zap.Error(err))
		return false
	}
	return true
}

// keepUnended keeps the end of t, whose write failed, with the events it
// carried, for endUnended; spooled says the spool holds it. ls.mu is
// held.
func (s *Server) keepUnended(t *turn, end *turnEnd, spooled bool) {
	ls := t.ls
	if ls.deleting {
		// Its rows go.
		if spooled {
			s.spool.remove(t.id)
		}
		return
	}
	u := unendedTurn{id: t.id, end: end, spooled: spooled, told: end.res}
	if n := end.size(); s.unendedBytes.Add(n) > maxUnendedBytes {
		s.unendedBytes.Add(-n)
		u.end = nil
		if spooled {
			s.log.Info("turn end kept in the spool only: past the bound on what memory keeps", zap.String("session_id", ls.id),
				zap.String("turn_id", t.id), zap.Int64("bytes", n))
		} else {
			s.log.Warn("turn end not kept to write later: past the bound on what is kept, and not spooled", zap.String("session_id", ls.id),
				zap.String("turn_id", t.id), zap.Int64("bytes", n))
		}
	}
	ls.unended = append(ls.unended, u)
}

// endUnended writes the ends of the turns of ls whose first write failed,
// each as it would have been written; one neither kept nor readable from
// the spool is ended as recovery ends a turn left by a process that died.
// Left running in the store, they read the session running to every
// reader of its row, and the next start's recovery published a second
// turn_complete for each. ls.mu is held.
func (s *Server) endUnended(ctx context.Context, ls *liveSession) error {
	for len(ls.unended) > 0 {
		u := ls.unended[0]
		end := u.end
		if end == nil && u.spooled {
			var err error
			if end, err = s.spool.load(u.id); err != nil {
				s.log.Error("turn end spooled but not read back", zap.String("session_id", ls.id), zap.String("turn_id", u.id), zap.Error(err))
				end = nil
			}
		}
		if end == nil {
			// What its clients saw is lost to the store: said here, as
			// the turn is recorded otherwise.
			s.log.Warn("turn end lost: recorded as recovery records one, cancelled, interrupted", zap.String("session_id", ls.id),
				zap.String("turn_id", u.id), zap.String("told_outcome", u.told.Outcome), zap.String("told_stop_reason", u.told.StopReason),
				zap.Int("told_content_bytes", len(u.told.Content)))
			it := interruptedTurn{SessionID: ls.id, TurnID: u.id, Surface: ls.surface}
			// nil: its turn_complete went out when it ended.
			if _, err := s.store.recoverTurn(ctx, it, true, interruptedMarker, nil); err != nil {
				return err
			}
		} else {
			// The session's last number is stored with the end, as the
			// first write would have stored its turn_complete's: the
			// entry may have published after it.
			if next := ls.nextSeq(); next != nil && (end.published == nil || *next-1 > *end.published) {
				last := *next - 1
				end.published = &last
			}
			wrote, err := s.store.endLate(ctx, end)
			if err != nil {
				return err
			}
			if !wrote {
				// Its first write committed after all, or its session
				// was deleted.
				s.log.Info("turn end not written late: the turn was not running any more", zap.String("session_id", ls.id), zap.String("turn_id", u.id))
			}
		}
		if u.end != nil {
			s.unendedBytes.Add(-u.end.size())
		}
		if u.spooled {
			s.spool.remove(u.id)
		}
		s.log.Info("turn end recorded late: its first write failed", zap.String("session_id", ls.id), zap.String("turn_id", u.id),
			zap.Bool("as_it_ended", end != nil))
		ls.unended[0] = unendedTurn{}
		ls.unended = ls.unended[1:]
	}
	ls.unended = nil
	return nil
}

// dropUnended forgets the ends ls keeps: its session's rows are deleted.
// ls.mu is held.
func (s *Server) dropUnended(ls *liveSession) {
	for _, u := range ls.unended {
		if u.end != nil {
			s.unendedBytes.Add(-u.end.size())
		}
		if u.spooled {
			s.spool.remove(u.id)
		}
	}
	ls.unended = nil
}

// writeSpooled writes the ends a process that died left in the spool,
// before recovery: each turn then reads as its clients were told, and
// recovery, finding it ended, publishes no second turn_complete. A turn
// not running any more (its first write committed after all, or an
// earlier start wrote it and could not remove the file) or of a session
// deleted is left as it is.
func (s *Server) writeSpooled(ctx context.Context, ends []*turnEnd) error {
	for _, e := range ends {
		wrote, err := s.store.endLate(ctx, e)
		if err != nil {
			return fmt.Errorf("write a spooled turn end: %w", err)
		}
		s.spool.remove(e.turnID)
		s.log.Info("turn end written from the spool: the process that ended the turn died before it was written",
			zap.String("session_id", e.sessionID), zap.String("turn_id", e.turnID), zap.Bool("written", wrote))
	}
	return nil
}

// endLate writes e and its events, unless the turn is not running in
// e's session: the first write may have committed after all (its answer
// lost), or the turn's session was deleted. It reports whether it wrote.
func (st *store) endLate(ctx context.Context, e *turnEnd) (bool, error) {
	wrote := false
	err := pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		var state string
		err := tx.QueryRow(ctx, "SELECT state FROM turns WHERE turn_id = $1 AND session_id = $2 FOR UPDATE", e.turnID, e.sessionID).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && state != turnRunning) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := insertEvents(ctx, tx, e.events); err != nil {
			return err
		}
		wrote = true
		return e.writeTx(ctx, tx)
	})
	if err != nil {
		return false, fmt.Errorf("write turn %s's end: %w", e.turnID, err)
	}
	return wrote, nil
}
