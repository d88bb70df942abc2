package session

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/pgtext"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Bounds of Resend: a gateway that missed more than this closes the
// followers instead (the client reads the transcript).
const (
	// maxResendTurns bounds the ended turns one Resend rebuilds.
	maxResendTurns = 8
	// maxResendBytes bounds the params of the updates one Resend
	// answers, within a gRPC message (16 MiB) with room for the rest.
	maxResendBytes = 8 << 20
)

// Resend rebuilds the updates of a session numbered past after_seq up to
// upto_seq (see the proto) from what is stored: each ended turn's end
// (turns.end_seq, the number its turn_complete took, its outcome,
// content and error), its checkpoint events (its text, thoughts, tool
// calls and results, in the order they were streamed) and where each
// update it published lives in them (the marks its batches of events
// carried, migration 0017, and its end's update_map, migration 0016:
// approval requests and history_trimmed notices among them since
// migration 0018, a request with the decision that settled it once one
// did, see approval.resent); for the turn still running, the map it
// keeps in memory, its pending events written first. So:
//
//   - a turn of which the gateway received nothing (after_seq is the
//     previous turn's end): its updates with their numbers (text
//     coalesced as checkpointed), then its turn_complete; a turn ended
//     before migration 0016 is renumbered from its events, unless it
//     asked for an approval or trimmed the history;
//   - a turn of which it received all but the turn_complete (after_seq
//     is the one before the turn's end): the turn_complete alone;
//   - a turn ended, or cut by a crash, of which it received part (a
//     hole mid-turn): the updates numbered past after_seq, with their
//     numbers, then its turn_complete (a cut turn's, its recovery's,
//     whose content is the text the turn had stored);
//   - the turn still running: its updates numbered past after_seq up
//     to upto_seq.
//
// The turns after the first must be ended and whole. The first one's
// start is the end of the turn before it: one that ended before
// migration 0014 has no number, so the turn after it is refused (its
// lone turn_complete aside), saying so. Anything else is a loss, said
// in lost: a number in the range no stored map holds, a turn cut by a
// crash past its last stored marks (the killed process's last numbers
// are stored nowhere), events trimmed away, past the bounds.
func (s *Server) Resend(ctx context.Context, req *sessionv1.ResendRequest) (*sessionv1.ResendResponse, error) {
	id := req.GetSessionId()
	if !ids.Token(id) {
		return nil, errInvalid(fmt.Sprintf("`session_id` %v", ids.ErrFormat))
	}
	after, upto := req.GetAfterSeq(), req.GetUptoSeq()
	if after < 0 || upto < 0 || (upto != 0 && upto <= after) {
		return nil, errInvalid(fmt.Sprintf("no range of updates from after %d up to %d", after, upto))
	}
	lost := func(why string) (*sessionv1.ResendResponse, error) {
		return &sessionv1.ResendResponse{Lost: why}, nil
	}
	stored, err := s.store.updateSeqs(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	row, ok := stored[id]
	if !ok || row.incarnation != req.GetIncarnation() {
		return lost("the session is gone")
	}
	// Read before the ended turns: a turn that ends meanwhile is read
	// ended.
	running := s.runningTurn(id, req.GetIncarnation())
	if upto == 0 {
		upto = s.liveUpdateSeq(id, req.GetIncarnation())
		if running != nil {
			upto = running.seq
		}
		if upto == noLiveHalf {
			upto = row.last
		}
		if upto < 0 {
			return lost("the session's last update number is not known")
		}
		if upto <= after {
			return &sessionv1.ResendResponse{UptoSeq: after}, nil
		}
	}
	// A turn whose end's write failed reads running in the store until
	// the end is written (unended.go): its updates are sent from the end
	// the service holds, as the store will give them once it is written.
	// Its row is read before the ended turns: an end written meanwhile
	// is read in both, and the store's wins.
	held, err := s.store.heldTurns(ctx, id, s.heldEnds(id, req.GetIncarnation()), after, upto)
	if err != nil {
		return nil, err
	}
	turns, before, err := s.store.endedTurns(ctx, id, after, upto, held)
	if err != nil {
		return nil, err
	}
	// The updates past the last ended turn's are the running turn's.
	var tail *runningTurn
	if n := len(turns); n == 0 || turns[n-1].endSeq != upto {
		lastEnd := after
		if n > 0 {
			lastEnd = turns[n-1].endSeq
		}
		switch {
		case running == nil && n == 0:
			return lost(fmt.Sprintf("no turn holds the updates after %d up to %d (one cut mid-stream)", after, upto))
		case running == nil || upto > running.seq:
			return lost(fmt.Sprintf("update %d is neither a turn's end nor the running turn's", upto))
		case running.updates == nil:
			return lost(fmt.Sprintf("updates of turn %s, still running, after %d were missed: where its updates are is not kept (it published more than %d, or text stored otherwise than sent)",
				running.t.id, lastEnd, maxMappedUpdates))
		case running.from < 0 || lastEnd < running.from:
			return lost(fmt.Sprintf("updates after %d were missed before turn %s, still running, began: they follow no turn's end", lastEnd, running.t.id))
		}
		tail = running
	}
	if n := len(turns); n > maxResendTurns || tail != nil && n+1 > maxResendTurns {
		return lost(fmt.Sprintf("more than %d turns were missed", maxResendTurns))
	}
	resp := &sessionv1.ResendResponse{UptoSeq: upto}
	size := 0
	prevEnd := before.seq
	for i, t := range turns {
		var ups []rebuilt
		switch {
		case i == 0 && after == t.endSeq-1 && !t.cut:
			// All but its turn_complete was received.
		case i == 0 && before.unnumbered != "":
			// Whether the gateway had any of the turn is not known, so
			// neither is what it missed: the end of the turn before
			// was not numbered (nor can it be derived: the numbers of
			// a turn's updates are stored nowhere but at its end).
			return lost(fmt.Sprintf("turn %s follows turn %s, which ended before its end's update number was stored (migration 0014): where turn %s's updates begin is not known",
				t.id, before.unnumbered, t.id))
		case i == 0 && t.cut && after > prevEnd:
			// Cut by a crash, part of it received: the updates numbered
			// past after, from where its batches of events stored each,
			// then its recovery's end.
			ups, _, err = s.store.turnUpdatesAfter(ctx, id, t.id, t.held, true, after, math.MaxInt64)
			switch {
			case errors.Is(err, errUnmarked):
				return lost(fmt.Sprintf("updates of turn %s after %d were missed mid-turn, and a crash cut the turn before it stored where its last updates are", t.id, after))
			case err != nil:
				return nil, err
			case ups == nil:
				return lost(fmt.Sprintf("updates of turn %s after %d were missed mid-turn, and a crash cut the turn: where its updates are is not stored whole (it published more than %d), or its events were trimmed",
					t.id, after, maxMappedUpdates))
			}
		case i == 0 && after > prevEnd:
			// Part of it received: the updates numbered past after,
			// from where the turn stored each update.
			var missing int64
			if ups, missing, err = s.store.turnUpdatesAfter(ctx, id, t.id, t.held, false, after, t.endSeq-1); err != nil {
				return nil, err
			}
			if ups == nil {
				return lost(fmt.Sprintf("updates of turn %s after %d were missed mid-turn: where its updates are is not stored (it ended before migration 0016, or published more than %d), or its events were trimmed",
					t.id, after, maxMappedUpdates))
			}
			if missing > 0 {
				return lost(unmappedUpdate(missing, t.id))
			}
		case i == 0 && after != prevEnd:
			return lost(fmt.Sprintf("updates of turn %s after %d were missed mid-turn: they follow no turn's end", t.id, after))
		default:
			// Missed whole: from where it stored each update, with
			// their numbers.
			upto := t.endSeq - 1
			if t.cut {
				upto = math.MaxInt64 // the killed process's last numbers are stored nowhere
			}
			var missing int64
			ups, missing, err = s.store.turnUpdatesAfter(ctx, id, t.id, t.held, t.cut, prevEnd, upto)
			switch {
			case errors.Is(err, errUnmarked):
				return lost(fmt.Sprintf("turn %s was missed, and a crash cut it before it stored where its last updates are", t.id))
			case err != nil:
				return nil, err
			case missing > 0:
				return lost(unmappedUpdate(missing, t.id))
			case ups != nil:
				break
			case t.held != nil:
				// Its end, once written, stores no map either: the
				// store would renumber it from its events, which are
				// the held end's too; not done twice here.
				return lost(fmt.Sprintf("turn %s was missed, its end is not written yet, and where its updates are is not kept whole (it published more than %d)", t.id, maxMappedUpdates))
			case t.cut:
				return lost(fmt.Sprintf("turn %s was missed, and a crash cut it: where its updates are is not stored whole (it published more than %d), or its events were trimmed", t.id, maxMappedUpdates))
			default:
				// Ended before migration 0016: rebuilt from its
				// events, renumbered, when they are all it published.
				if ups, err = s.store.turnUpdates(ctx, id, t.id); err != nil {
					return nil, err
				}
				if ups == nil {
					return lost(fmt.Sprintf("the events of turn %s are no longer stored (trimmed)", t.id))
				}
				asked, err := s.store.askedOrTrimmed(ctx, id, t.id)
				if err != nil {
					return nil, err
				}
				if asked {
					return lost(fmt.Sprintf("turn %s, ended before migration 0016, asked for an approval or trimmed the history: their numbers are stored nowhere", t.id))
				}
			}
		}
		mid := len(ups) > 0 && ups[0].seq != 0
		ups = append(ups, t.complete())
		// Numbered so that the last is the turn's end, each past the
		// previous turn's: a rebuilt turn has at most as many updates
		// as it published (its text coalesced). Updates rebuilt from the
		// middle of a turn keep the numbers they were published with.
		from := t.endSeq - int64(len(ups))
		if !mid && from < prevEnd {
			return lost(fmt.Sprintf("turn %s cannot be renumbered within its numbers", t.id))
		}
		for j, u := range ups {
			members := appendMembers(nil, u.f)
			params, err := appendUpdateParams(nil, id, u.typ, members)
			if err != nil {
				return nil, fmt.Errorf("resend turn %s: %w", t.id, err)
			}
			size += len(params)
			if size > maxResendBytes {
				return lost(fmt.Sprintf("the updates missed pass %d bytes", maxResendBytes))
			}
			startedBy, seq := "", from+int64(j)+1
			switch {
			case mid && j < len(ups)-1:
				seq = u.seq
			case mid:
				seq = t.endSeq
			}
			if j == 0 && len(ups) > 1 && (i > 0 || after <= prevEnd) {
				// The turn's first update: the gateway had none of it.
				startedBy = t.connID
			}
			resp.Updates = append(resp.Updates, bus.EncodeSessionUpdate(id, bus.UpdateType(u.typ), seq, params, startedBy))
		}
		prevEnd = t.endSeq
	}
	if tail == nil {
		return resp, nil
	}
	// Every update the snapshot maps lives in an event added to the
	// turn's log before it was mapped: written now, if not before.
	if err := s.cp.write(ctx, tail.t.log, nil); err != nil {
		return nil, fmt.Errorf("resend turn %s: %w", tail.t.id, err)
	}
	events, _, err := s.store.markedEvents(ctx, id, tail.t.id)
	if err != nil {
		return nil, err
	}
	// The decisions the turn acted on win over the stored ones (an ask
	// decided and being stored is waited for, see settleAsks): the row
	// of an ask cancelled, or whose decision could not be stored, is
	// pending until the turn's end. So an ask is never sent again
	// undecided once its turn gave it up (the client would be asked
	// again about a call that will not run), nor with another decision
	// than the one the turn acted on. It is sent, not left out: its
	// number must be filled (a gap is a loss to the gateway), and a
	// follower that rejoins learns the ask is closed, as seed 004 closes
	// an ask on its turn's stop ("decided in the durable agent"). SPEC
	// says nothing of updates sent again.
	asks, err := s.store.turnAsks(ctx, id, tail.t.id)
	if err != nil {
		return nil, err
	}
	if err := s.settleAsks(ctx, tail.t, asks); err != nil {
		return nil, fmt.Errorf("resend turn %s: %w", tail.t.id, err)
	}
	ups, missing, _ := rebuildMapped(tail.t.id, events, asks, tail.updates, max(after, tail.from), upto)
	switch {
	case ups == nil:
		return lost(fmt.Sprintf("the events of turn %s, still running, are not stored as it published them", tail.t.id))
	case missing > 0:
		return lost(unmappedUpdate(missing, tail.t.id))
	}
	for j, u := range ups {
		params, err := appendUpdateParams(nil, id, u.typ, appendMembers(nil, u.f))
		if err != nil {
			return nil, fmt.Errorf("resend turn %s: %w", tail.t.id, err)
		}
		if size += len(params); size > maxResendBytes {
			return lost(fmt.Sprintf("the updates missed pass %d bytes", maxResendBytes))
		}
		startedBy := ""
		if j == 0 && after <= tail.from {
			// The turn's first update: the gateway had none of it.
			startedBy = tail.t.connID
		}
		resp.Updates = append(resp.Updates, bus.EncodeSessionUpdate(id, bus.UpdateType(u.typ), u.seq, params, startedBy))
	}
	return resp, nil
}

// unmappedUpdate says that update seq of turn turnID cannot be sent again.
func unmappedUpdate(seq int64, turnID string) string {
	return fmt.Sprintf("update %d of turn %s is not among those whose place it stored (an approval request or a history_trimmed notice of a turn ended before migration 0018, or an update lost for want of a number)",
		seq, turnID)
}

// runningTurn is Resend's snapshot of the turn running on a session: the
// number its updates follow (-1: not known), the session's last update
// number then, and where each update the turn had published lives (nil
// when that is not kept whole).
type runningTurn struct {
	t         *turn
	from, seq int64
	updates   []int64
}

// runningTurn is the snapshot of the turn running on session id of
// incarnation, nil when none is.
func (s *Server) runningTurn(id string, incarnation int64) *runningTurn {
	ls := s.lookupLive(id)
	if ls == nil || ls.incarnation != incarnation {
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	t := ls.turn
	if t == nil || t.ended {
		return nil
	}
	t.mapMu.Lock()
	defer t.mapMu.Unlock()
	r := &runningTurn{t: t, from: t.seqFrom, seq: ls.lastSeq()}
	if !t.mapOver {
		r.updates = append([]int64{}, t.updates...)
	}
	return r
}

// rebuilt is one update Resend sends again: its type and params, and
// the number it was published with when that is known (else 0).
type rebuilt struct {
	typ string
	f   fields
	seq int64
}

// endedTurn is a turn's end as stored.
type endedTurn struct {
	id, connID                         string
	outcome, stopReason, content, fail string
	gen                                *int64
	endSeq                             int64
	cut                                bool // ended by recovery after a crash
	// held is its end when its write failed and it is not written yet
	// (unended.go): the store reads the turn running.
	held *turnEnd
}

// complete is t's turn_complete, as the turn (or its recovery) published
// it.
func (t endedTurn) complete() rebuilt {
	f := fields{"turn_id": t.id, "outcome": t.outcome, "content": t.content, "stop_reason": t.stopReason}
	if t.gen != nil {
		f["client_turn_generation"] = *t.gen
	}
	if t.fail != "" {
		f["error"] = t.fail
	}
	return rebuilt{typ: UpdateTurnComplete, f: f}
}

// endedTurns reads the turns of the session whose turn_complete took a
// number past after up to upto, by that number (one more than
// maxResendTurns at most), and where their updates begin (see prevEnd).
// held are the turns whose end is held (heldTurns): a turn the store
// reads ended too is taken from the store.
func (st *store) endedTurns(ctx context.Context, id string, after, upto int64, held []endedTurn) ([]endedTurn, prevEnd, error) {
	rows, err := st.db.Query(ctx, `SELECT turn_id, connection_id, outcome, stop_reason, content, error, client_turn_generation, end_seq,
		stop_reason = $4
		FROM turns WHERE session_id = $1 AND end_seq > $2 AND end_seq <= $3 AND state <> 'running'
		ORDER BY end_seq LIMIT $5`, id, after, upto, stopInterrupted, maxResendTurns+1)
	if err != nil {
		return nil, prevEnd{}, fmt.Errorf("read ended turns: %w", err)
	}
	turns, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (endedTurn, error) {
		var t endedTurn
		err := row.Scan(&t.id, &t.connID, &t.outcome, &t.stopReason, &t.content, &t.fail, &t.gen, &t.endSeq, &t.cut)
		return t, err
	})
	if err != nil {
		return nil, prevEnd{}, fmt.Errorf("read ended turns: %w", err)
	}
	if len(held) > 0 {
		for _, h := range held {
			if !slices.ContainsFunc(turns, func(t endedTurn) bool { return t.id == h.id }) {
				turns = append(turns, h)
			}
		}
		slices.SortFunc(turns, func(a, b endedTurn) int { return cmp.Compare(a.endSeq, b.endSeq) })
		turns = turns[:min(len(turns), maxResendTurns+1)]
	}
	if len(turns) == 0 {
		return nil, prevEnd{}, nil
	}
	// The turn before the first, the one that ended just before it: the
	// number it ended with, or none (it ended before migration 0014).
	// Only that turn matters: turns further back, without a number or
	// not, say nothing of where the first one's updates begin.
	var (
		prevID string
		prev   *int64
	)
	err = st.db.QueryRow(ctx, `SELECT p.turn_id, p.end_seq FROM turns p
		WHERE p.session_id = $1 AND p.turn_id <> $2 AND p.started_at <= (SELECT started_at FROM turns WHERE turn_id = $2)
		ORDER BY p.started_at DESC LIMIT 1`, id, turns[0].id).Scan(&prevID, &prev)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return turns, prevEnd{}, nil
	case err != nil:
		return nil, prevEnd{}, fmt.Errorf("read ended turns: %w", err)
	case prev == nil:
		return turns, prevEnd{seq: -1, unnumbered: prevID}, nil
	}
	return turns, prevEnd{seq: *prev}, nil
}

// prevEnd is where the updates of the turns Resend rebuilds begin: the
// number the turn before them ended with (0 when there was none), or,
// when that turn's end has no number stored (it ended before migration
// 0014), that turn's id, seq being -1.
type prevEnd struct {
	seq        int64
	unnumbered string
}

// turnUpdates rebuilds the updates turn showed from its checkpoint
// events, without its turn_complete: nil when they are no longer stored
// whole (its prompt's event is gone with the rest when trimmed).
func (st *store) turnUpdates(ctx context.Context, sessionID, turnID string) ([]rebuilt, error) {
	rows, err := st.db.Query(ctx, `SELECT e.kind, e.content, e.tool_call_id, e.name, COALESCE(c.status, ''),
		COALESCE(c.output_bytes, octet_length(e.content))
		FROM checkpoint_events e
		LEFT JOIN tool_calls c ON e.kind = 'tool_result' AND c.session_id = e.session_id AND c.tool_call_id = e.tool_call_id
		WHERE e.session_id = $1 AND e.turn_id = $2 ORDER BY e.seq`, sessionID, turnID)
	if err != nil {
		return nil, fmt.Errorf("read turn events: %w", err)
	}
	var (
		out                              []rebuilt
		whole                            bool
		kind, content, callID, name, sts string
		outBytes                         int64
	)
	_, err = pgx.ForEachRow(rows, []any{&kind, &content, &callID, &name, &sts, &outBytes}, func() error {
		e := storedEvent{kind: kind, content: content, callID: callID, name: name, status: sts, outBytes: outBytes}
		switch kind {
		case eventUser:
			whole = true
		case eventText, eventThought:
			out = append(out, e.chunk(turnID, content))
		case eventToolCall, eventToolResult:
			out = append(out, e.tool(turnID))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read turn events: %w", err)
	}
	if !whole {
		return nil, nil
	}
	if out == nil {
		out = []rebuilt{}
	}
	return out, nil
}

// storedEvent is a checkpoint event as Resend reads it.
type storedEvent struct {
	kind, content, callID, name, status string
	outBytes                            int64
}

// recovered reports whether e is the result the recovery of a turn cut
// by a crash records for a call that never got one (recoverTurn): no
// update was published for it (the recovery publishes the turn's end
// alone), so it has no mark and is not sent again.
func (e storedEvent) recovered() bool {
	return e.kind == eventToolResult && e.content == toolInterruptedOutput && e.status == toolCancelled
}

// chunk is a message or thought chunk of e's, saying text.
func (e storedEvent) chunk(turnID, text string) rebuilt {
	if e.kind == eventThought {
		return rebuilt{typ: UpdateThoughtChunk, f: fields{"turn_id": turnID, "text": text}}
	}
	return rebuilt{typ: UpdateMessageChunk, f: fields{"turn_id": turnID, "text": text}}
}

// tool is the tool_call or tool_result update of e.
func (e storedEvent) tool(turnID string) rebuilt {
	if e.kind == eventToolCall {
		var input any = e.content
		if json.Valid([]byte(e.content)) {
			input = json.RawMessage(e.content)
		}
		return rebuilt{typ: UpdateToolCall, f: fields{"turn_id": turnID, "tool_call_id": e.callID, "name": e.name, "raw_input": input}}
	}
	// The output as the session kept it (16 KiB), with the whole
	// output's size the live tool_result said (stored since migration
	// 0015; before it, the kept output's).
	return rebuilt{typ: UpdateToolResult, f: fields{"turn_id": turnID, "tool_call_id": e.callID, "name": e.name,
		"raw_output": e.content, "output_bytes": e.outBytes, "status": e.status}}
}

// maxMappedUpdates bounds the updates of a turn whose place in its
// checkpoint events is kept for its end to store (turns.update_map): 24
// bytes each, 768 KiB for a turn at most. A turn that published more
// cannot be sent again from its middle.
const maxMappedUpdates = 1 << 15

// Marks of the updates that are no chunk (see mapUpdate's end): a tool
// call or result lives in its event; an approval request in its tool
// call's; a history_trimmed notice in no event, its counts packed in the
// event's place (trimCounts).
const (
	markTool     = -1
	markApproval = -2
	markTrim     = -3
)

// trimCounts packs a trim's counts in a mark's event place.
func trimCounts(dropped, keptTurns int) int64 {
	return int64(min(dropped, math.MaxInt32))<<32 | int64(min(keptTurns, math.MaxInt32))
}

// trimNotice is the history_trimmed update of turn turnID.
func trimNotice(turnID string, dropped, keptTurns int64) fields {
	return fields{"turn_id": turnID, "dropped_messages": dropped, "kept_turns": keptTurns, "reason": trimReason}
}

// mapUpdate records that the update numbered seq (0: not published) lives
// in checkpoint event event, ending at offset end of its content for a
// chunk (or a mark: markTool, markApproval, markTrim).
func (t *turn) mapUpdate(seq, event int64, end int) {
	if t.mapOver || (seq == 0 && end < 0) {
		return
	}
	if len(t.updates) >= 3*maxMappedUpdates {
		t.stopMap()
		return
	}
	t.updates = append(t.updates, seq, event, int64(end))
}

// stopMap gives up t's map: it is no longer whole.
func (t *turn) stopMap() {
	t.updates, t.mapOver = nil, true
	t.log.stopMarks()
}

// endMap is what the turn's end stores as turns.update_map, within the
// transaction that writes its last events (which took the marks pending
// then): the marks no batch of events carried, or nil when the map is
// not whole.
func (t *turn) endMap() []int64 {
	tail := t.log.tailMarks()
	if t.mapOver {
		return nil
	}
	return tail
}

// errUnmarked is turnUpdatesAfter's answer for a turn cut by a crash
// that stored events past the last update whose place it stored.
var errUnmarked = errors.New("events past the marked updates")

// turnUpdatesAfter rebuilds the updates of ended turn turnID numbered
// past after up to upto, each with its number, without its
// turn_complete, from where the turn stored each (the marks its batches
// of checkpoint events carried, migration 0017, then those its end
// stored in update_map, migration 0016) and its checkpoint events (see
// rebuildMapped). nil when that is not stored whole or disagrees with
// the events (trimmed). A turn cut by a crash (cut) has its batches'
// marks alone: errUnmarked when it stored events past them, whose
// updates' numbers died with the process.
//
// held, when not nil, is the turn's end not written yet (heldTurns): its
// update map and events are taken from it, as the store will hold them.
func (st *store) turnUpdatesAfter(ctx context.Context, sessionID, turnID string, held *turnEnd, cut bool, after, upto int64) ([]rebuilt, int64, error) {
	var (
		tail    []int64
		trimmed int
	)
	if err := st.db.QueryRow(ctx, "SELECT update_map, trimmed_messages FROM turns WHERE turn_id = $1", turnID).Scan(&tail, &trimmed); err != nil {
		return nil, 0, fmt.Errorf("read turn update map: %w", err)
	}
	if held != nil {
		tail = held.updateMap
	}
	if tail == nil && !cut {
		return nil, 0, nil
	}
	events, marks, err := st.markedEvents(ctx, sessionID, turnID)
	if err != nil {
		return nil, 0, err
	}
	asks, err := st.turnAsks(ctx, sessionID, turnID)
	if err != nil {
		return nil, 0, err
	}
	if held != nil {
		if marks, err = st.addHeldEvents(ctx, sessionID, events, marks, held.events); err != nil {
			return nil, 0, err
		}
		held.settleAsks(asks)
	}
	m := append(marks, tail...)
	trimMarked := false
	for i := 0; i < len(m); i += 3 {
		if m[i] < 0 {
			return nil, 0, nil // its map was given up (see stopMap)
		}
		trimMarked = trimMarked || m[i+2] == markTrim
	}
	ups, missing, covered := rebuildMapped(turnID, events, asks, m, after, upto)
	switch {
	case ups == nil:
	case cut && (!covered || trimmed > 0 && !trimMarked):
		// Cut before its batch held where its last updates are (or
		// before migration 0017).
		return nil, 0, errUnmarked
	case missing == 0 && trimmed > 0 && !trimMarked:
		// Its notice, its first update, was not mapped (it ended
		// before migration 0018): missed, unless the gateway had
		// updates of the turn.
		if first := firstMapped(m); first == 0 || first > after {
			missing = after + 1
		}
	}
	return ups, missing, nil
}

// firstMapped is the number of the first update m maps, 0 when none.
func firstMapped(m []int64) int64 {
	for i := 0; i < len(m); i += 3 {
		if m[i] > 0 {
			return m[i]
		}
	}
	return 0
}

// turnAsks reads the approval requests of turn turnID by their tool
// call's id, each with the decision that settled it as stored (d; none
// while it is pending): a person's or the timeout's, or the cancellation
// of a turn that ended first (or was cut by a crash) before one came.
func (st *store) turnAsks(ctx context.Context, sessionID, turnID string) (map[string]*approval, error) {
	rows, err := st.db.Query(ctx, `SELECT request_id, tool_call_id, tool_name, arguments_summary, COALESCE(timeout_secs, 0),
		status, decision, surface
		FROM approvals WHERE turn_id = $1 AND session_id = $2`, turnID, sessionID)
	if err != nil {
		return nil, fmt.Errorf("read turn approvals: %w", err)
	}
	asks := map[string]*approval{}
	var (
		a                approval
		secs             int64
		status, dec, srf string
	)
	_, err = pgx.ForEachRow(rows, []any{&a.RequestID, &a.ToolCallID, &a.ToolName, &a.Summary, &secs, &status, &dec, &srf}, func() error {
		c := a
		c.Timeout = time.Duration(secs) * time.Second
		switch status {
		case "decided":
			c.d = decision{Decision: dec, Surface: srf}
		case "cancelled":
			c.d = decision{Decision: decisionCancelled, Surface: surfaceService}
		}
		asks[c.ToolCallID] = &c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read turn approvals: %w", err)
	}
	return asks, nil
}

// askedOrTrimmed reports whether turn turnID published an approval
// request or a history_trimmed notice.
func (st *store) askedOrTrimmed(ctx context.Context, sessionID, turnID string) (bool, error) {
	var yes bool
	err := st.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM approvals WHERE turn_id = $1 AND session_id = $2)
		OR EXISTS (SELECT 1 FROM turns WHERE turn_id = $1 AND trimmed_messages > 0)`, turnID, sessionID).Scan(&yes)
	if err != nil {
		return false, fmt.Errorf("read turn approvals: %w", err)
	}
	return yes, nil
}

// markedEvents reads turn turnID's checkpoint events by seq, and the marks
// they carry, in order.
func (st *store) markedEvents(ctx context.Context, sessionID, turnID string) (map[int64]storedEvent, []int64, error) {
	rows, err := st.db.Query(ctx, `SELECT e.seq, e.kind, e.content, e.tool_call_id, e.name, COALESCE(c.status, ''),
		COALESCE(c.output_bytes, octet_length(e.content)), e.update_marks
		FROM checkpoint_events e
		LEFT JOIN tool_calls c ON e.kind = 'tool_result' AND c.session_id = e.session_id AND c.tool_call_id = e.tool_call_id
		WHERE e.session_id = $1 AND e.turn_id = $2 ORDER BY e.seq`, sessionID, turnID)
	if err != nil {
		return nil, nil, fmt.Errorf("read turn events: %w", err)
	}
	events := map[int64]storedEvent{}
	var (
		seq    int64
		e      storedEvent
		packed []byte
		marks  []int64
	)
	_, err = pgx.ForEachRow(rows, []any{&seq, &e.kind, &e.content, &e.callID, &e.name, &e.status, &e.outBytes, &packed}, func() error {
		events[seq] = e
		marks = append(marks, unpackMarks(packed)...)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read turn events: %w", err)
	}
	return events, marks, nil
}

// rebuildMapped rebuilds the updates of turn turnID numbered past after
// up to upto, each with its number, from m, where the turn published
// each (see mapUpdate), and its checkpoint events: a chunk's text is cut
// from its event's where it was published, the chunks in (after, upto]
// of one event sent as one (numbered as the last of them). ups is nil
// when m disagrees with the events (trimmed); missing, when not 0, is a
// number in the range that m does not map, past the turn's first one
// (the numbers before a turn's first update, between the last number
// used and a reservation a process just started read, were never
// given); covered is whether m holds all of every event.
func rebuildMapped(turnID string, events map[int64]storedEvent, asks map[string]*approval, m []int64, after, upto int64) (ups []rebuilt, missing int64, covered bool) {
	if len(m)%3 != 0 {
		return nil, 0, false
	}
	out := []rebuilt{}
	ends := map[int64]int{} // where each event's text sent so far ends
	tools, asked := map[int64]bool{}, 0
	lastEvent := int64(-1)
	// want is the number the next update must take: after's next once
	// the turn has one at or before after, the one past the last in the
	// range; 0 before the turn's first.
	want := int64(0)
	for i := 0; i < len(m); i += 3 {
		useq, ev, end := m[i], m[i+1], m[i+2]
		if useq > upto {
			break
		}
		switch {
		case useq == 0:
		case useq <= after:
			want = after + 1
		default:
			if want != 0 && useq != want && missing == 0 {
				missing = want
			}
			want = useq + 1
		}
		if end == markTrim {
			if useq > after {
				u := rebuilt{typ: UpdateHistoryTrimmed, f: trimNotice(turnID, ev>>32, ev&(1<<32-1)), seq: useq}
				out, lastEvent = append(out, u), -1
			}
			continue
		}
		e, ok := events[ev]
		if !ok {
			return nil, 0, false
		}
		if end == markApproval {
			a, ok := asks[e.callID]
			if !ok {
				return nil, 0, false
			}
			asked++
			if useq > after {
				out, lastEvent = append(out, rebuilt{typ: UpdateApprovalRequest, f: a.resent(turnID), seq: useq}), -1
			}
			continue
		}
		if end < 0 {
			tools[ev] = true
			if useq > after {
				u := e.tool(turnID)
				u.seq = useq
				out, lastEvent = append(out, u), -1
			}
			continue
		}
		start := ends[ev]
		if end < int64(start) || end > int64(len(e.content)) {
			return nil, 0, false
		}
		ends[ev] = int(end)
		if useq <= after {
			continue
		}
		text := e.content[start:end]
		if n := len(out); n > 0 && lastEvent == ev {
			// The chunk after the last one sent, of the same event: one
			// update, numbered as its last chunk.
			out[n-1].f["text"] = out[n-1].f["text"].(string) + text
			out[n-1].seq = useq
			continue
		}
		u := e.chunk(turnID, text)
		u.seq = useq
		out, lastEvent = append(out, u), ev
	}
	if missing == 0 && upto != math.MaxInt64 && want <= upto {
		missing = max(want, after+1)
	}
	covered = asked == len(asks)
	for ev, e := range events {
		switch e.kind {
		case eventText, eventThought:
			covered = covered && ends[ev] == len(e.content)
		case eventToolCall, eventToolResult:
			covered = covered && (tools[ev] || e.recovered())
		}
	}
	return out, missing, covered
}

// publishMapped publishes an update of t's that lives in checkpoint
// event event (end as mapUpdate takes it) and maps it, as one step for
// Resend (see turn.mapMu).
func (t *turn) publishMapped(s *Server, typ string, f fields, event int64, end int) int64 {
	t.mapMu.Lock()
	defer t.mapMu.Unlock()
	seq := s.publish(t.ls, typ, f)
	t.mapUpdate(seq, event, end)
	t.log.mark(seq, event, end)
	return seq
}

// heldEnds is the ends session id of incarnation holds of turns whose
// end's write failed (unended.go), by turn id, read back from the spool
// where memory does not keep them: until one is written its turn's row
// reads running, without its end, its update map and the events the
// failed write carried.
func (s *Server) heldEnds(id string, incarnation int64) map[string]*turnEnd {
	ls := s.lookupLive(id)
	if ls == nil || ls.incarnation != incarnation {
		return nil
	}
	var (
		ends    map[string]*turnEnd
		spooled []string
	)
	ls.mu.Lock()
	for _, u := range ls.unended {
		switch {
		case u.end != nil:
			if ends == nil {
				ends = map[string]*turnEnd{}
			}
			ends[u.id] = u.end
		case u.spooled:
			spooled = append(spooled, u.id)
		}
	}
	ls.mu.Unlock()
	for _, tid := range spooled {
		// Read outside the lock: up to a reply's size from the disk.
		end, err := s.spool.load(tid)
		if err != nil {
			s.log.Warn("turn end spooled but not read back to send its updates again", zap.String("session_id", id), zap.String("turn_id", tid), zap.Error(err))
			continue
		}
		if ends == nil {
			ends = map[string]*turnEnd{}
		}
		ends[tid] = end
	}
	return ends
}

// heldTurns is the turns of ends (heldEnds) that the store still reads
// running in session id and whose turn_complete took a number past after
// up to upto, as endedTurns reads them once their end is written: the
// row gives what the turn's start stored, the end the rest.
func (st *store) heldTurns(ctx context.Context, id string, ends map[string]*turnEnd, after, upto int64) ([]endedTurn, error) {
	var turnIDs []string
	for tid, e := range ends {
		if e.published != nil && *e.published > after && *e.published <= upto {
			turnIDs = append(turnIDs, tid)
		}
	}
	if len(turnIDs) == 0 {
		return nil, nil
	}
	rows, err := st.db.Query(ctx, `SELECT turn_id, connection_id, client_turn_generation FROM turns
		WHERE session_id = $1 AND turn_id = ANY($2) AND state = 'running'`, id, turnIDs)
	if err != nil {
		return nil, fmt.Errorf("read held turns: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (endedTurn, error) {
		var t endedTurn
		if err := row.Scan(&t.id, &t.connID, &t.gen); err != nil {
			return t, fmt.Errorf("read held turns: %w", err)
		}
		e := ends[t.id]
		t.outcome, t.stopReason, t.content, t.fail = e.res.Outcome, e.res.StopReason, pgtext.Text(e.res.Content), pgtext.Text(e.res.Error)
		t.endSeq, t.cut, t.held = *e.published, e.res.StopReason == stopInterrupted, e
		return t, nil
	})
}

// addHeldEvents adds to events and marks (markedEvents') the events a
// held end carries, as its write will store them: an event stored
// already stays as stored, a tool result has its call's stored status
// and size.
func (st *store) addHeldEvents(ctx context.Context, sessionID string, events map[int64]storedEvent, marks []int64, held []cpEvent) ([]int64, error) {
	var results []string
	for _, ev := range held {
		if ev.Kind == eventToolResult {
			results = append(results, ev.ToolCallID)
		}
	}
	type call struct {
		status string
		bytes  *int64
	}
	calls := map[string]call{}
	if len(results) > 0 {
		rows, err := st.db.Query(ctx, "SELECT tool_call_id, status, output_bytes FROM tool_calls WHERE session_id = $1 AND tool_call_id = ANY($2)", sessionID, results)
		if err != nil {
			return nil, fmt.Errorf("read held tool calls: %w", err)
		}
		var (
			tid string
			c   call
		)
		if _, err := pgx.ForEachRow(rows, []any{&tid, &c.status, &c.bytes}, func() error {
			calls[tid] = c
			return nil
		}); err != nil {
			return nil, fmt.Errorf("read held tool calls: %w", err)
		}
	}
	for _, ev := range held {
		if _, ok := events[ev.Seq]; ok {
			continue
		}
		e := storedEvent{kind: ev.Kind, content: pgtext.Text(ev.Content), callID: ev.ToolCallID, name: pgtext.Text(ev.Name)}
		e.outBytes = int64(len(e.content))
		if ev.Kind == eventToolResult {
			if c, ok := calls[ev.ToolCallID]; ok {
				e.status = c.status
				if c.bytes != nil {
					e.outBytes = *c.bytes
				}
			}
		}
		events[ev.Seq] = e
		marks = append(marks, unpackMarks(ev.Marks)...)
	}
	return marks, nil
}

// settleAsks gives asks the status e's write will store: the asks whose
// decision could not be stored, and those still pending, cancelled.
func (e *turnEnd) settleAsks(asks map[string]*approval) {
	for _, a := range asks {
		if a.d == (decision{}) || slices.Contains(e.unrecorded, a.RequestID) {
			a.d = decision{Decision: decisionCancelled, Surface: surfaceService}
		}
	}
}
