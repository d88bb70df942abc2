package session

import (
	"context"
	"sync"
)

// liveSession is the in-memory half of a session: the running turn, its
// pending approvals and the update sequence. The database is the record;
// this is what one process needs to run turns. One session service
// process owns every turn (it is not replicated), so one running turn per
// session is enforced here.
type liveSession struct {
	id string

	// mu guards the fields below it. Admission of a turn, its end and the
	// lifecycle methods take it, so they are serialized per session.
	mu            sync.Mutex
	turn          *turn
	deleting      bool
	approvals     map[string]*approval
	alwaysAllowed map[string]bool

	// pubMu orders publishing: seq is the last number used, seqReserved
	// the bound stored in the database. Lock order: mu before pubMu.
	pubMu       sync.Mutex
	seq         int64
	seqReserved int64
}

// live returns the in-memory session for a stored row, creating it on
// first use (after a restart it resumes the stored sequence bound).
func (s *Server) live(row sessionRow) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls, ok := s.lives[row.ID]; ok {
		return ls
	}
	ls := &liveSession{
		id:            row.ID,
		approvals:     map[string]*approval{},
		alwaysAllowed: map[string]bool{},
		seq:           row.UpdateSeq,
		seqReserved:   row.UpdateSeq,
	}
	for _, t := range row.AlwaysAllowed {
		ls.alwaysAllowed[t] = true
	}
	s.lives[row.ID] = ls
	return ls
}

// lookupLive returns the in-memory session if there is one.
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
