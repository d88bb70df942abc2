package session

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/subjects"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// UpdateSubjectWildcard matches the update subjects of every session.
const UpdateSubjectWildcard = subjects.SessionUpdatePrefix + "*.update"

// UpdateSubject is the NATS subject carrying the session/update events of
// one session. Each message is a protobuf-encoded sessionv1.Update:
//
//   - session_id: the session;
//   - type: the SPEC §5 update type (agent_message_chunk, agent_thought_chunk,
//     tool_call, tool_result, approval_request, turn_complete);
//   - seq: 1, 2, 3, ... per session, one per update, in publish order and
//     never reused, also across restarts of the service (a restart after a
//     crash may skip numbers, never repeat them);
//   - json: the exact params object of the session/update notification;
//   - connection_id: empty, meaning every attached connection.
//
// Session ids never contain '.', '*', '>' or spaces, so the subject has
// exactly four tokens.
func UpdateSubject(sessionID string) string { return subjects.SessionUpdate(sessionID) }

// DecodeUpdate parses a message published on an update subject.
func DecodeUpdate(data []byte) (*sessionv1.Update, error) {
	u := &sessionv1.Update{}
	if err := proto.Unmarshal(data, u); err != nil {
		return nil, fmt.Errorf("decode session update: %w", err)
	}
	return u, nil
}

// Update types of SPEC §5.
const (
	UpdateMessageChunk    = "agent_message_chunk"
	UpdateThoughtChunk    = "agent_thought_chunk"
	UpdateToolCall        = "tool_call"
	UpdateToolResult      = "tool_result"
	UpdateApprovalRequest = "approval_request"
	UpdateTurnComplete    = "turn_complete"
)

// seqBlock is how many sequence numbers are reserved in the database at a
// time, so publishing needs a write only once per block.
const seqBlock = 1024

// fields is one update's params beside session_id and type.
type fields map[string]any

// publish sends one update of ls. Sequence numbers are taken and messages
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
	// The camelCase aliases SPEC §1 requires on session/update params.
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
	data, err := proto.Marshal(&sessionv1.Update{SessionId: ls.id, Type: typ, Seq: ls.seq, Json: string(body)})
	if err != nil {
		s.log.Error("encode session update", zap.String("session_id", ls.id), zap.Error(err))
		return
	}
	if err := s.nc.Publish(UpdateSubject(ls.id), data); err != nil {
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
