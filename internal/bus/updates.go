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

// updateTypes maps each type's wire name, as UpdateTypeName writes it,
// to its enum value: the session service names the type of every update
// it publishes, and building the enum's name for each cost a string and
// an upper-cased copy of it.
var updateTypes = func() map[string]busv1.UpdateType {
	m := make(map[string]busv1.UpdateType, len(busv1.UpdateType_value))
	for _, v := range busv1.UpdateType_value {
		if t := busv1.UpdateType(v); t != busv1.UpdateType_UPDATE_TYPE_UNSPECIFIED {
			m[UpdateTypeName(t)] = t
		}
	}
	return m
}()

// UpdateType maps a wire type name, in any case, to its enum value
// (UNSPECIFIED when unknown).
func UpdateType(name string) busv1.UpdateType {
	if t, ok := updateTypes[name]; ok {
		return t
	}
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
