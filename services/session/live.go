package session

import (
	"context"
	"errors"
	"sync"

	"go.uber.org/zap"
)

// liveSession is the in-memory half of a session: the running turn, its
// pending approvals and the update sequence. The database is the record;
// this is what one process needs to run turns. One session service
// process owns every turn (it is not replicated), so one running turn per
// session is enforced here.
type liveSession struct {
	id string
	// owner and surface never change for a session id; kept here so a
	// kill or delete can reach a running turn without the database.
	owner, surface string

	// refs is guarded by Server.mu: how many callers hold the entry.
	refs int

	// mu guards the fields below it. Admission of a turn, its end and the
	// lifecycle methods take it, so they are serialized per session.
	mu       sync.Mutex
	turn     *turn
	deleting bool
	// ending is set while close or kill cancels the turn and writes the
	// new state: no turn is admitted meanwhile.
	ending        string
	approvals     map[string]*approval
	alwaysAllowed map[string]bool

	// pubMu orders publishing: seq is the last number used, seqReserved
	// the bound stored in the database. Lock order: mu, pubMu, Server.mu.
	pubMu       sync.Mutex
	seq         int64
	seqReserved int64
}

// hold returns the in-memory session of a stored row, creating it on
// first use, until release is called. A new entry starts from the stored
// sequence bound and allow_always tools, read again rather than taken
// from a row that may be older.
func (s *Server) hold(ctx context.Context, row sessionRow) (ls *liveSession, release func()) {
	if ls := s.holdExisting(row.ID); ls != nil {
		return ls, func() { s.release(ls) }
	}
	seq, allowed, err := s.store.liveState(ctx, row.ID)
	if err != nil {
		if !errors.Is(err, errNoRow) {
			s.log.Warn("read session sequence", zap.String("session_id", row.ID), zap.Error(err))
		}
		seq, allowed = row.UpdateSeq, row.AlwaysAllowed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls, ok := s.lives[row.ID]; ok {
		ls.refs++
		return ls, func() { s.release(ls) }
	}
	ls = &liveSession{
		id: row.ID, owner: row.Owner, surface: row.Surface, refs: 1,
		approvals: map[string]*approval{}, alwaysAllowed: map[string]bool{},
		seq: seq, seqReserved: seq,
	}
	for _, t := range allowed {
		ls.alwaysAllowed[t] = true
	}
	s.lives[row.ID] = ls
	return ls, func() { s.release(ls) }
}

// holdExisting holds the in-memory session if there is one.
func (s *Server) holdExisting(id string) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.lives[id]
	if ls != nil {
		ls.refs++
	}
	return ls
}

func (s *Server) release(ls *liveSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls.refs--
}

// lookupLive returns the in-memory session if there is one, without
// holding it: for reading a running turn or a pending approval.
func (s *Server) lookupLive(id string) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lives[id]
}

func (s *Server) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.lives, id)
}

// running returns the session's running turn, or nil.
func (ls *liveSession) running() *turn {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.turn
}

// stopTurn cancels t with cause and waits for it to end, at most the
// unwind bound; it reports whether the turn ended in time.
func (s *Server) stopTurn(ctx context.Context, t *turn, cause error) bool {
	t.cancel(cause)
	wait, cancel := context.WithTimeout(ctx, s.cfg.UnwindTimeout)
	defer cancel()
	select {
	case <-t.done:
		return true
	case <-wait.Done():
		return false
	}
}
