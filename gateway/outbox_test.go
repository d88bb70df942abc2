package gateway

import (
	"fmt"
	"testing"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A prompt collects its turn's completion whether it asks before or after
// the turn_complete was written, and a connection watching many turns
// remembers only the recent ones.
func TestOutboxTurnCompletions(t *testing.T) {
	o := newOutbox(nil, nil)
	early := o.turnDone("t-early")
	if closed(early) {
		t.Fatal("completed before its turn_complete")
	}
	o.markCompleted("t-early")
	if !closed(early) {
		t.Fatal("a waiting prompt was not woken")
	}
	o.forgetTurn("t-early")

	o.markCompleted("t-late")
	if !closed(o.turnDone("t-late")) {
		t.Fatal("a completion written before the prompt asked was lost")
	}
	o.forgetTurn("t-late")

	for i := range 10 * maxRecentTurns {
		o.markCompleted(fmt.Sprintf("other-%d", i))
	}
	if n := len(o.completed); n > maxRecentTurns {
		t.Fatalf("%d completions remembered, want at most %d", n, maxRecentTurns)
	}
	if !closed(o.turnDone(fmt.Sprintf("other-%d", 10*maxRecentTurns-1))) {
		t.Fatal("the most recent completion was dropped")
	}
}
