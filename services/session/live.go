package session

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/bus"
)

// DefaultLiveIdleTimeout is how long the in-memory half of a session with
// no running turn and no pending approval is kept after its last use.
const DefaultLiveIdleTimeout = 10 * time.Minute

// liveSession is the in-memory half of a session: the running turn, its
// pending approvals and the update sequence. The database is the record;
// this is what one process needs to run turns. One session service
// process owns every turn (it is not replicated), so one running turn per
// session is enforced here.
//
// Entries are made on first use and evicted once idle (see evictIdle):
// the map holds the sessions in use, not every session ever touched.
type liveSession struct {
	id string
	// incarnation is the stored session's (sessionRow.Incarnation): its
	// updates' subject names it.
	incarnation int64
	// owner and surface never change for a session id; kept here so a
	// kill or delete can reach a running turn without the database.
	owner, surface string

	// refs and lastUsed are guarded by Server.mu: an entry someone holds
	// is never evicted.
	refs     int
	lastUsed time.Time

	// mu guards the fields below it. Admission of a turn, its end and the
	// lifecycle methods take it, so they are serialized per session.
	mu       sync.Mutex
	turn     *turn
	deleting bool
	// ending is set while close or kill cancels the turn and writes the
	// new state: no turn is admitted meanwhile. endingDone is closed when
	// it is cleared (see settle).
	ending        string
	endingDone    chan struct{}
	approvals     map[string]*approval
	alwaysAllowed map[string]bool
	// unended are turns this process ended whose end's write failed
	// (finish), with what it would have written: running in the store,
	// idle here. The next admission, the entry's eviction or shutdown
	// writes them (endUnended). At most one: an admission writes it
	// before its turn starts, or is refused.
	unended []unendedTurn

	// pubMu orders publishing: seq is the last number used, seqReserved
	// the bound stored in the database. Lock order: mu, pubMu, Server.mu.
	pubMu       sync.Mutex
	seq         int64
	seqReserved int64
	// seqUnsure: seq was not read from the stored bound (the read
	// failed) and may be behind it; seqLost counts the updates not
	// published since a reservation failed. Either way the next
	// reservation is made past the stored bound (reserveSeqLocked).
	seqUnsure bool
	seqLost   int64
	// seqFrom is seq as the entry was made: while seq is still that, the
	// entry has numbered nothing, and seqLast, the last number published
	// as stored then, is the session's (see liveUpdateSeq).
	seqFrom, seqLast int64
	// pubFailed counts the updates the bus refused since the last one
	// it took (publishFields).
	pubFailed int64
	// pub publishes on the session's subject; body is the buffer its
	// updates' params are encoded into. Both are made on first publish.
	pub  *bus.SessionUpdatePublisher
	body []byte
}

// hold returns the in-memory session of a stored row, creating it on
// first use, and keeps it from eviction until release is called. A new
// entry starts from the stored sequence bound and allow_always tools,
// read again so that an entry evicted a moment ago is continued exactly.
func (s *Server) hold(ctx context.Context, row sessionRow) (ls *liveSession, release func()) {
	if ls := s.holdExisting(row.ID, row.Incarnation); ls != nil {
		return ls, func() { s.release(ls) }
	}
	seq, last, allowed, err := s.store.liveState(ctx, row.ID)
	unsure := false
	if err != nil {
		if !errors.Is(err, errNoRow) {
			s.log.Warn("read session sequence", zap.String("session_id", row.ID), zap.Error(err))
		}
		// row's bound may be older than the stored one (an entry evicted
		// since row was read stored the last number it used).
		seq, last, allowed, unsure = row.UpdateSeq, row.LastSeq, row.AlwaysAllowed, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ls = &liveSession{
		id: row.ID, incarnation: row.Incarnation, owner: row.Owner, surface: row.Surface, refs: 1,
		approvals: map[string]*approval{}, alwaysAllowed: map[string]bool{},
		seq: seq, seqReserved: seq, seqUnsure: unsure, seqFrom: seq, seqLast: last,
	}
	if cur, ok := s.lives[row.ID]; ok {
		switch {
		case cur.incarnation == row.Incarnation:
			cur.refs++
			return cur, func() { s.release(cur) }
		case cur.incarnation > row.Incarnation:
			// row was read before its session was deleted and the id
			// named a new one: the session it names is gone. The entry
			// is kept out of memory and refuses what is asked of it as a
			// deleted session's does.
			ls.deleting = true
			return ls, func() { s.release(ls) }
		}
		// cur is a deleted session's, on its way out (Delete forgets only
		// its own entry): the new session's replaces it, so that it never
		// publishes on the deleted one's subject.
	}
	for _, t := range allowed {
		ls.alwaysAllowed[t] = true
	}
	s.lives[row.ID] = ls
	return ls, func() { s.release(ls) }
}

// holdExisting holds the in-memory session of id if there is one, of
// the given incarnation (0: whichever it is).
func (s *Server) holdExisting(id string, incarnation int64) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.lives[id]
	if ls == nil || (incarnation != 0 && ls.incarnation != incarnation) {
		return nil
	}
	ls.refs++
	return ls
}

func (s *Server) release(ls *liveSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls.refs--
	ls.lastUsed = time.Now()
}

// lookupLive returns the in-memory session if there is one, without
// holding it: for reading a running turn or a pending approval, which
// keep an entry from eviction themselves.
func (s *Server) lookupLive(id string) *liveSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lives[id]
}

// liveOf is lookupLive for row: nil when the entry under its id is of
// another incarnation, a deleted session's, whose turn may outlive its
// rows (Delete waits for it a bounded time) and is not row's.
func (s *Server) liveOf(row sessionRow) *liveSession {
	if ls := s.lookupLive(row.ID); ls != nil && ls.incarnation == row.Incarnation {
		return ls
	}
	return nil
}

// forget removes ls from memory unless a new session under its id has
// replaced it already.
func (s *Server) forget(ls *liveSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lives[ls.id] == ls {
		delete(s.lives, ls.id)
	}
}

// settle waits until no close or kill of ls is under way and returns
// with ls.mu held; or, when ctx ends first, returns its error with ls.mu
// not held. A lifecycle call that arrives during another waits for it
// and then acts on what it left: refused at once, a delete or kill
// arriving while a close waited for the turn was told the session "is
// closed; resume it", which it was not yet (and would not be, had the
// close's write failed), and a closed session may be deleted or killed.
func (ls *liveSession) settle(ctx context.Context) error {
	ls.mu.Lock()
	for ls.ending != "" {
		done := ls.endingDone
		ls.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		ls.mu.Lock()
	}
	return nil
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

// evictIdle drops the in-memory sessions nobody holds that have been
// unused since before now minus the idle timeout and have no running
// turn, no pending approval and no lifecycle change under way. The ends
// of its turns not written yet (endUnended) and the last update sequence
// number used are stored first, so the next entry for the session
// continues it without a gap; an entry whose ends or number cannot be
// stored stays for the next sweep. It returns how many it dropped.
func (s *Server) evictIdle(now time.Time) int {
	cutoff := now.Add(-s.cfg.LiveIdleTimeout)
	s.mu.Lock()
	var idle []*liveSession
	for _, ls := range s.lives {
		if ls.refs == 0 && !ls.lastUsed.After(cutoff) {
			idle = append(idle, ls)
		}
	}
	s.mu.Unlock()
	evicted := 0
	for _, ls := range idle {
		if s.evict(ls, cutoff) {
			evicted++
		}
	}
	return evicted
}

func (s *Server) evict(ls *liveSession, cutoff time.Time) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.turn != nil || len(ls.approvals) > 0 || ls.deleting || ls.ending != "" {
		return false
	}
	if len(ls.unended) > 0 {
		// Their ends are written now: evicted, the entry took them along
		// and the turns read running until the service's next start.
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.UnwindTimeout)
		err := s.endUnended(ctx, ls)
		cancel()
		if err != nil {
			s.log.Warn("write turn ends before eviction", zap.String("session_id", ls.id), zap.Error(err))
			return false
		}
	}
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if used := ls.seqToRelease(); used != ls.seqReserved {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.UnwindTimeout)
		err := s.store.releaseSeq(ctx, ls.id, used, ls.seqReserved)
		cancel()
		if err != nil {
			s.log.Warn("store update sequence", zap.String("session_id", ls.id), zap.Error(err))
			return false
		}
		ls.seqReserved = used
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls.refs != 0 || ls.lastUsed.After(cutoff) || s.lives[ls.id] != ls {
		return false
	}
	delete(s.lives, ls.id)
	return true
}

// sweep evicts idle entries every half idle timeout until stop is closed.
func (s *Server) sweep(stop <-chan struct{}) {
	t := time.NewTicker(max(s.cfg.LiveIdleTimeout/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if n := s.evictIdle(now); n > 0 {
				s.log.Debug("idle sessions evicted from memory", zap.Int("evicted", n))
			}
		}
	}
}
