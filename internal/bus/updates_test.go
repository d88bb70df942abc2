package bus

import (
	"strings"
	"testing"

	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// Every type's wire name maps back to it, in any case; anything else is
// UNSPECIFIED.
func TestUpdateTypeNames(t *testing.T) {
	for _, v := range busv1.UpdateType_value {
		want := busv1.UpdateType(v)
		if want == busv1.UpdateType_UPDATE_TYPE_UNSPECIFIED {
			continue
		}
		name := UpdateTypeName(want)
		for _, n := range []string{name, strings.ToUpper(name)} {
			if got := UpdateType(n); got != want {
				t.Errorf("UpdateType(%q) = %v, want %v", n, got, want)
			}
		}
	}
	if got := UpdateType(UpdateMessageChunk); got != busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK {
		t.Errorf("UpdateType(%q) = %v", UpdateMessageChunk, got)
	}
	for _, n := range []string{"", "unspecified", "UPDATE_TYPE_TOOL_CALL", "tool call", "turn_completed"} {
		if got := UpdateType(n); got != busv1.UpdateType_UPDATE_TYPE_UNSPECIFIED {
			t.Errorf("UpdateType(%q) = %v, want UNSPECIFIED", n, got)
		}
	}
}

func BenchmarkUpdateType(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if UpdateType(UpdateMessageChunk) != busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK {
			b.Fatal("wrong type")
		}
	}
}
