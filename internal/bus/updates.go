package bus

import (
	"strings"

	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// The session/update types of docs/spec.md §5, as they appear in the
// notification's "type" field.
const (
	UpdateMessageChunk    = "agent_message_chunk"
	UpdateThoughtChunk    = "agent_thought_chunk"
	UpdateToolCall        = "tool_call"
	UpdateToolResult      = "tool_result"
	UpdateApprovalRequest = "approval_request"
	UpdateHistoryTrimmed  = "history_trimmed"
	UpdateTurnComplete    = "turn_complete"
)

// UpdateType maps a wire type name to its enum value (UNSPECIFIED when
// unknown).
func UpdateType(name string) busv1.UpdateType {
	v, ok := busv1.UpdateType_value["UPDATE_TYPE_"+strings.ToUpper(name)]
	if !ok {
		return busv1.UpdateType_UPDATE_TYPE_UNSPECIFIED
	}
	return busv1.UpdateType(v)
}

// UpdateTypeName is the wire name of t ("" when unspecified).
func UpdateTypeName(t busv1.UpdateType) string {
	if t == busv1.UpdateType_UPDATE_TYPE_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(t.String(), "UPDATE_TYPE_"))
}
