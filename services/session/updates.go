package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/jsonstr"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// Update types of docs/spec.md §5 (defined once, in internal/bus).
const (
	UpdateMessageChunk    = bus.UpdateMessageChunk
	UpdateThoughtChunk    = bus.UpdateThoughtChunk
	UpdateToolCall        = bus.UpdateToolCall
	UpdateToolResult      = bus.UpdateToolResult
	UpdateApprovalRequest = bus.UpdateApprovalRequest
	UpdateHistoryTrimmed  = bus.UpdateHistoryTrimmed
	UpdateTurnComplete    = bus.UpdateTurnComplete
)

// seqBlock is how many sequence numbers are reserved in the database at a
// time, so publishing needs a write only once per block.
const seqBlock = 1024

// seqToReserve is the bound a turn starting on ls reserves in its own
// transaction, or 0 when more than half a block is left. Without it the
// turn's first update would wait for a write and commit of its own
// before going out (publishFields), on a fresh session and on every
// session once its block is spent: the first chunk of every turn that
// starts with many others at once would wait behind all their commits.
func (ls *liveSession) seqToReserve() int64 {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if ls.seqReserved-ls.seq > seqBlock/2 || ls.seqUnsure || ls.seqLost > 0 {
		// An entry whose start is not known to be the stored bound, or
		// that lost updates, reserves on its first publish (see
		// reserveSeqLocked), relative to the stored bound.
		return 0
	}
	return ls.seq + seqBlock
}

// seqReservedUpTo records a bound stored by a committed reservation.
func (ls *liveSession) seqReservedUpTo(upto int64) {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	ls.seqReserved = max(ls.seqReserved, upto)
}

// fields is one update's params beside session_id and type.
type fields map[string]any

// camelAliases are the camelCase aliases docs/spec.md §1 requires on
// session/update params, by the snake_case name they copy.
var camelAliases = map[string]string{"tool_call_id": "toolCallId", "raw_input": "rawInput", "raw_output": "rawOutput"}

// field is one params member: a string in str, anything else in val. A
// string stored in an interface is copied to the heap; the streaming
// path's members (text, turn and session ids, type) are strings on every
// update and stay out of one.
type field struct {
	key   string
	val   any
	str   string
	isStr bool
}

// strField is a string member.
func strField(key, s string) field { return field{key: key, str: s, isStr: true} }

// publish sends one update of ls (updates are defined in
// proto/clawmesh/bus/v1 and sent through internal/bus). Sequence numbers are taken and messages
// handed to NATS under ls.pubMu, so NATS carries them in seq order. A
// publish failure is logged and does not stop the turn: updates are a
// view, the transcript is the record.
// It returns the update's seq, 0 when none was given.
func (s *Server) publish(ls *liveSession, typ string, f fields) int64 {
	var buf [12]field
	return s.publishFields(ls, typ, appendMembers(buf[:0], f))
}

// appendMembers appends f's members, with the camelCase aliases, to
// members.
func appendMembers(members []field, f fields) []field {
	for k, v := range f {
		switch k {
		case "session_id", "sessionId", "type":
			continue // the update's own, below
		}
		if isCamelAliasOf(f, k) {
			continue // the alias copies its snake_case value, below
		}
		members = append(members, field{key: k, val: v})
		if camel, ok := camelAliases[k]; ok {
			members = append(members, field{key: camel, val: v})
		}
	}
	return members
}

// isCamelAliasOf reports whether k is the camelCase alias of a snake_case
// member f has.
func isCamelAliasOf(f fields, k string) bool {
	for snake, camel := range camelAliases {
		if camel == k {
			if _, ok := f[snake]; ok {
				return true
			}
		}
	}
	return false
}

// publishChunk publishes a streamed chunk (message or thought) of turnID:
// the streaming path, with no map.
func (s *Server) publishChunk(ls *liveSession, typ, turnID, text string) int64 {
	var buf [5]field
	return s.publishFields(ls, typ, append(buf[:0], strField("text", text), strField("turn_id", turnID)))
}

// publishFields publishes an update whose params are members plus
// session_id, sessionId and type. Members may come in any order: the
// params are encoded with their keys sorted, the bytes encoding/json
// gives for the same map. It returns the update's seq, 0 when none was
// given.
func (s *Server) publishFields(ls *liveSession, typ string, members []field) (seq int64) {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	body, err := appendUpdateParams(ls.body[:0], ls.id, typ, members)
	if err != nil {
		s.log.Error("encode session update", zap.String("session_id", ls.id), zap.String("type", typ), zap.Error(err))
		return 0
	}
	if cap(body) <= maxKeptBody {
		ls.body = body
	}
	// The bound itself is never given (see reserveSeqLocked).
	if ls.seq+1 >= ls.seqReserved && !s.reserveSeqLocked(ls) {
		// No number past the stored bound is ever given: the next process
		// starts from that bound, and would give it again. The update is
		// lost (updates are a view, the transcript is the record); the
		// number skipped once a reservation lands tells subscribers so.
		if ls.seqLost == 0 {
			s.log.Warn("session updates not published: their sequence numbers could not be reserved",
				zap.String("session_id", ls.id), zap.Int64("seq", ls.seq))
		}
		ls.seqLost++
		return 0
	}
	ls.seq++
	if err := s.publishLocked(ls, bus.UpdateType(typ), ls.seq, body); err != nil {
		// One line for a run of failures, and one when it ends: with the
		// bus down and its connection's buffer full every update fails,
		// and one fast turn logged 13,143 lines (4.6 MB of the log's 8 MB
		// bound) in 20 s, rotating out what said why.
		if ls.pubFailed == 0 {
			s.log.Warn("publish session update", zap.String("session_id", ls.id), zap.String("type", typ), zap.Int64("seq", ls.seq), zap.Error(err))
		}
		ls.pubFailed++
		// The number is given all the same: no follower gets it.
		return ls.seq
	}
	if ls.pubFailed > 0 {
		s.log.Info("session updates published again", zap.String("session_id", ls.id),
			zap.Int64("lost_updates", ls.pubFailed), zap.Int64("seq", ls.seq))
		ls.pubFailed = 0
	}
	return ls.seq
}

// reserveSeqLocked stores a new bound for ls's sequence numbers, the
// next seqBlock of them, and reports whether it did; ls.pubMu is held. A
// reservation survives the turn's cancellation: it must land before a
// number is used.
//
// The block starts after both ls.seq and the bound stored before: an
// entry that started from a bound older than the stored one (its reading
// failed, see hold) never gives a number given before. After updates
// were lost for want of a reservation, one number is skipped, so that
// subscribers see a gap in seq where updates are missing.
//
// The last number of a reservation, the stored bound, is kept unused
// until the next reservation covers it: updates are lost only with that
// number unused, so a process that dies then (its loss told to nobody)
// leaves the next one, which numbers on from the stored bound, a gap
// where they are missing. Numbering up to the bound itself, a loss and a
// crash left no trace: the next process's first update followed the
// last published one, and a follower took a turn cut short for whole.
func (s *Server) reserveSeqLocked(ls *liveSession) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	upto, err := s.store.reserveSeqAfter(ctx, ls.id, ls.seq, seqBlock)
	cancel()
	if errors.Is(err, errNoRow) {
		// The session's row is gone (deleted): no process will start
		// from its bound, so the numbers need no reservation.
		ls.seqReserved = ls.seq + seqBlock
		return true
	}
	if err != nil {
		if ls.seqLost == 0 {
			s.log.Warn("reserve update sequence", zap.String("session_id", ls.id), zap.Error(err))
		}
		return false
	}
	from := upto - seqBlock
	switch {
	case from == ls.seqReserved && ls.seq < from && !ls.seqUnsure:
		// Our own bound, its number kept unused: it is the next one.
	case from != ls.seq:
		s.log.Warn("update sequence continued past the stored bound", zap.String("session_id", ls.id),
			zap.Int64("seq", ls.seq), zap.Int64("stored_bound", from))
		fallthrough
	default:
		ls.seq = from
	}
	ls.seqReserved, ls.seqUnsure = upto, false
	if ls.seqLost > 0 {
		s.log.Warn("session update sequence reserved again", zap.String("session_id", ls.id),
			zap.Int64("lost_updates", ls.seqLost), zap.Int64("skipped_seq", ls.seq+1))
		ls.seq++
		ls.seqLost = 0
	}
	return true
}

// seqToRelease is the bound a clean stop stores for ls (releaseSeq):
// the last number used, or past it when updates were lost since, so
// that the next process leaves a gap for them. ls.pubMu is held.
func (ls *liveSession) seqToRelease() int64 {
	if ls.seqLost > 0 {
		return ls.seq + 1
	}
	return ls.seq
}

// nextSeq is the number ls's next update takes (after a skip for
// updates lost), or nil when not known: numbered from a bound that may
// be behind the stored one (seqUnsure), it is past it. A reservation
// that lands past the stored bound numbers it higher; the number
// returned is then one never used, and a follower can have received
// none between it and the one used.
func (ls *liveSession) nextSeq() *int64 {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if ls.seqUnsure {
		return nil
	}
	next := ls.seqToRelease() + 1
	return &next
}

// publishDeleted announces the session's deletion, after every update it
// published and with no sequence number of its own: every gateway then
// detaches its connections from the id.
func (s *Server) publishDeleted(ls *liveSession) {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if err := s.publishLocked(ls, busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED, 0, nil); err != nil {
		s.log.Warn("announce session deletion", zap.String("session_id", ls.id), zap.Error(err))
	}
}

// publishTurnStarted announces a turn admitted on ls, started by
// connection connID, before any update of it: a gateway that follows
// the session for a prompt not yet admitted sends that prompt's
// connection the session's updates only from its own turn's start (see
// busv1.UpdateType_UPDATE_TYPE_TURN_STARTED). Like the deletion's, the
// announcement has no sequence number of its own.
func (s *Server) publishTurnStarted(ls *liveSession, connID string) {
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if ls.pub == nil {
		pub, err := bus.NewSessionUpdatePublisher(s.nc, ls.id, ls.incarnation)
		if err != nil {
			s.log.Warn("announce turn start", zap.String("session_id", ls.id), zap.Error(err))
			return
		}
		ls.pub = pub
	}
	if err := ls.pub.PublishTurnStarted(connID); err != nil {
		s.log.Warn("announce turn start", zap.String("session_id", ls.id), zap.Error(err))
	}
}

// publishLocked publishes through the session's publisher, made on first
// use; ls.pubMu is held.
func (s *Server) publishLocked(ls *liveSession, typ busv1.UpdateType, seq int64, params []byte) error {
	if ls.pub == nil {
		pub, err := bus.NewSessionUpdatePublisher(s.nc, ls.id, ls.incarnation)
		if err != nil {
			return err
		}
		ls.pub = pub
	}
	return ls.pub.Publish(typ, seq, params)
}

// maxKeptBody bounds the encoding buffer a session keeps between updates:
// enough for every streamed chunk; a large update (a tool's output) is
// encoded into a fresh buffer the collector takes back.
const maxKeptBody = 4 << 10

// appendUpdateParams appends the params object of an update of session
// id: members plus session_id, sessionId and type (appended to members:
// room for three more spares an allocation).
func appendUpdateParams(b []byte, id, typ string, members []field) ([]byte, error) {
	return appendParams(b, append(members, strField("session_id", id), strField("sessionId", id), strField("type", typ)))
}

// appendParams appends the JSON object of members, keys sorted (the
// order encoding/json gives a map), each value as encoding/json encodes
// it. Strings (streamed text above all) are written by jsonstr, with
// encoding/json's escapes; other values of types not listed below go
// through encoding/json.
func appendParams(b []byte, members []field) ([]byte, error) {
	// Insertion sort: a handful of members.
	for i := 1; i < len(members); i++ {
		for j := i; j > 0 && members[j].key < members[j-1].key; j-- {
			members[j], members[j-1] = members[j-1], members[j]
		}
	}
	b = append(b, '{')
	for i, m := range members {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonstr.Append(b, m.key)
		b = append(b, ':')
		var err error
		if m.isStr {
			b = jsonstr.Append(b, m.str)
		} else if b, err = appendValue(b, m.val); err != nil {
			return nil, fmt.Errorf("%s: %w", m.key, err)
		}
	}
	return append(b, '}'), nil
}

func appendValue(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case string:
		return jsonstr.Append(b, v), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case nil:
		return append(b, "null"...), nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, raw...), nil
}

// flush waits until NATS has every update published so far, so that
// turn_complete is on its way before Prompt answers.
func (s *Server) flush() {
	if err := s.nc.FlushTimeout(s.cfg.UnwindTimeout); err != nil {
		s.log.Warn("flush session updates", zap.Error(err))
	}
}
