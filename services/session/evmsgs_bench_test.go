package session

import (
	"strings"
	"testing"
)

// BenchmarkEventsToMessages: the checkpoint events of one long reply, a
// turn's context rebuilt from them at every later prompt (until a trim
// writes a snapshot past them): a 4 MiB reply checkpointed 4 KiB at a
// time is 1024 text events of one step.
func BenchmarkEventsToMessages(b *testing.B) {
	piece := strings.Repeat("x", 4<<10)
	evs := []cpEvent{{Kind: eventUser, TurnID: "t", Content: "go"}}
	for i := range 1024 {
		evs = append(evs, cpEvent{Seq: int64(i + 1), Kind: eventText, TurnID: "t", Content: piece})
	}
	for b.Loop() {
		msgs := eventsToMessages(evs)
		if len(msgs) != 2 || len(msgs[1].Content) != 4<<20 {
			b.Fatalf("%d messages", len(msgs))
		}
	}
}
