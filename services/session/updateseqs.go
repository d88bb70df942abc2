package session

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// MaxUpdateSeqs bounds the sessions one UpdateSeqs call asks about.
const MaxUpdateSeqs = 1000

// UpdateSeqs answers, for each session named, the seq of the last update
// it published (see the proto). A gateway asks it when its bus link came
// back: a session whose number is the last the gateway received lost no
// update meanwhile, and its followers stay.
//
// The number is the live half's when there is one of the incarnation
// asked about that has numbered an update (read after the rows and
// before the flush below: an update published after the read is one the
// gateway's new subscription receives), else the stored one: the last number published, stored at
// each turn's end (a turn cut by a crash: its recovery's turn_complete,
// see recover) and at a clean stop (published_seq). Only while a turn
// runs, or on a row from before that column, is it not known: then the
// stored bound answers, a reservation past what a process that died used,
// and the gateway closes the followers (a turn cut by a crash lost its
// end anyway). Before, the bound always answered, and after a crash
// (SIGKILL) the followers of every session were closed, nothing lost.
// Anything not known is -1, which the gateway takes for a loss.
func (s *Server) UpdateSeqs(ctx context.Context, req *sessionv1.UpdateSeqsRequest) (*sessionv1.UpdateSeqsResponse, error) {
	asked := req.GetSessions()
	if len(asked) > MaxUpdateSeqs {
		return nil, errInvalid(fmt.Sprintf("at most %d sessions may be asked about at once, not %d", MaxUpdateSeqs, len(asked)))
	}
	ids := make([]string, len(asked))
	for i, a := range asked {
		ids[i] = a.GetSessionId()
	}
	stored, err := s.store.updateSeqs(ctx, ids)
	if err != nil {
		return nil, err
	}
	if hook := updateSeqsBetweenReads.Load(); hook != nil {
		(*hook)()
	}
	// The live halves after the rows: a session whose first turn was
	// admitted between the two reads, read the other way, had no live
	// half yet and a row whose turn had reserved the next block and
	// cleared the last number published, and answered the block's bound,
	// a number no update took (a gateway then closed its followers). A
	// session with no live half now had none when its row was read:
	// only a live half starts a turn.
	seqs := make([]int64, len(asked))
	for i, a := range asked {
		row, ok := stored[a.GetSessionId()]
		live := s.liveUpdateSeq(a.GetSessionId(), a.GetIncarnation())
		switch {
		case !ok || row.incarnation != a.GetIncarnation():
			seqs[i] = -1
		case live == noLiveHalf:
			seqs[i] = row.last
		default:
			seqs[i] = live
		}
	}
	// What was published up to the numbers read is at the bus server
	// before the answer, so that the gateway knows that an update it has
	// not received by the end of a round trip of its own was lost;
	// unless this process's own link is down: then it reaches the server,
	// or not, once the link is back, and the gateway waits for it a
	// bounded time.
	flushed := false
	if s.nc != nil {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.nc.FlushWithContext(fctx)
		cancel()
		if err != nil {
			s.log.Debug("flush session updates before UpdateSeqs answers", zap.Error(err))
		}
		flushed = err == nil
	}
	return &sessionv1.UpdateSeqsResponse{Seqs: seqs, Flushed: flushed}, nil
}

// updateSeqOf is UpdateSeqs's number for row's session, read now (row
// may be older: its stored bound counts only without a live half).
func (s *Server) updateSeqOf(row sessionRow) int64 {
	if seq := s.liveUpdateSeq(row.ID, row.Incarnation); seq != noLiveHalf {
		return seq
	}
	return row.LastSeq
}

// updateSeqsBetweenReads, when set (tests only), runs in UpdateSeqs
// between its reads of the stored rows and of the live halves.
var updateSeqsBetweenReads atomic.Pointer[func()]

// noLiveHalf is liveUpdateSeq's answer for a session with no live half of
// the incarnation asked about: its stored bound tells.
const noLiveHalf = -2

// liveUpdateSeq is the last number the live half of the session's
// incarnation used: with updates lost for want of a reservation, the
// number the next reservation skips for them; -1 when its start was not
// read from the stored bound (its numbers may repeat others); noLiveHalf
// without a live half of that incarnation. One that has numbered nothing
// answers the last number published as stored when it was made: its
// start is the stored bound, which after a crash is a reservation, not a
// number used. (Answered by the store's row instead, a session whose
// turn had begun, its reservation made and its first update not yet
// numbered, read as a hole: published_seq is cleared at a turn's
// start, and the bound answered.)
func (s *Server) liveUpdateSeq(id string, incarnation int64) int64 {
	ls := s.lookupLive(id)
	if ls == nil || ls.incarnation != incarnation {
		return noLiveHalf
	}
	return ls.lastSeq()
}

// lastSeq is the number of ls's last update (see liveUpdateSeq), -1
// when not known.
func (ls *liveSession) lastSeq() int64 {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	switch {
	case ls.seqUnsure:
		return -1
	case ls.seqLost > 0:
		return ls.seq + 1
	case ls.seq == ls.seqFrom:
		return ls.seqLast
	}
	return ls.seq
}

// seqRow is a session's incarnation and last update seq as stored (see
// sessionRow.LastSeq).
type seqRow struct{ incarnation, last int64 }

// updateSeqs reads the incarnation and stored last update seq of those
// of ids a session row holds.
func (st *store) updateSeqs(ctx context.Context, ids []string) (map[string]seqRow, error) {
	rows, err := st.db.Query(ctx, "SELECT session_id, incarnation, COALESCE(published_seq, update_seq) FROM sessions WHERE session_id = ANY($1::text[])", ids)
	if err != nil {
		return nil, fmt.Errorf("read update sequences: %w", err)
	}
	out := make(map[string]seqRow, len(ids))
	var (
		id string
		r  seqRow
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &r.incarnation, &r.last}, func() error {
		out[id] = r
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read update sequences: %w", err)
	}
	return out, nil
}
