package session

import (
	"context"
	"encoding/json"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
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

// fields is one update's params beside session_id and type.
type fields map[string]any

// publish sends one update of ls (updates are defined in
// proto/clawmesh/bus/v1 and sent through internal/bus). Sequence numbers are taken and messages
// handed to NATS under ls.pubMu, so NATS carries them in seq order. A
// publish failure is logged and does not stop the turn: updates are a
// view, the transcript is the record.
func (s *Server) publish(ls *liveSession, typ string, f fields) {
	params := make(map[string]any, len(f)+3)
	for k, v := range f {
		params[k] = v
	}
	params["session_id"] = ls.id
	params["sessionId"] = ls.id
	params["type"] = typ
	// The camelCase aliases docs/spec.md §1 requires on session/update params.
	for snake, camel := range map[string]string{"tool_call_id": "toolCallId", "raw_input": "rawInput", "raw_output": "rawOutput"} {
		if v, ok := params[snake]; ok {
			params[camel] = v
		}
	}
	body, err := json.Marshal(params)
	if err != nil {
		s.log.Error("encode session update", zap.String("session_id", ls.id), zap.String("type", typ), zap.Error(err))
		return
	}

	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if ls.seq >= ls.seqReserved {
		// A reservation survives the turn's cancellation: it must land
		// before the number is used.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.store.reserveSeq(ctx, ls.id, ls.seq+seqBlock)
		cancel()
		if err != nil {
			s.log.Warn("reserve update sequence", zap.String("session_id", ls.id), zap.Error(err))
		} else {
			ls.seqReserved = ls.seq + seqBlock
		}
	}
	ls.seq++
	u := &busv1.SessionUpdate{SessionId: ls.id, Type: bus.UpdateType(typ), Seq: ls.seq, Json: string(body)}
	if err := bus.PublishSessionUpdate(s.nc, u); err != nil {
		s.log.Warn("publish session update", zap.String("session_id", ls.id), zap.String("type", typ), zap.Int64("seq", ls.seq), zap.Error(err))
	}
}

// flush waits until NATS has every update published so far, so that
// turn_complete is on its way before Prompt answers.
func (s *Server) flush() {
	if err := s.nc.FlushTimeout(s.cfg.UnwindTimeout); err != nil {
		s.log.Warn("flush session updates", zap.Error(err))
	}
}
