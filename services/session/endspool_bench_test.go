package session

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// BenchmarkSpoolEnd is what spooling a failed end adds before its
// turn_complete goes out (the write, synced, then its removal): a short
// reply with a batch of events, and a 4 MiB reply (MaxReplyBytes) carried
// whole by its events too. Only figures: no assertion on them.
func BenchmarkSpoolEnd(b *testing.B) {
	for _, size := range []int{64, 4 << 20} {
		b.Run(fmt.Sprintf("reply_%d", size), func(b *testing.B) {
			sp, _, err := openEndSpool(b.TempDir(), zap.NewNop())
			if err != nil {
				b.Fatal(err)
			}
			reply := strings.Repeat("x", size)
			e := &turnEnd{sessionID: "sess_1", turnID: "turn_1", res: turnResult{Outcome: OutcomeCompleted, StopReason: stopEndTurn, Content: reply},
				said: reply, events: []cpEvent{{SessionID: "sess_1", TurnID: "turn_1", Seq: 2, Kind: eventText, Content: reply}}}
			b.SetBytes(int64(2 * size))
			for b.Loop() {
				if err := sp.put(e); err != nil {
					b.Fatal(err)
				}
				sp.remove(e.turnID)
			}
		})
	}
}
