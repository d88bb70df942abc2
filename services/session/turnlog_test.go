package session

import (
	"strings"
	"testing"
)

// newTestTurnLog is a turn's log whose writer never runs: take and
// putBack stand in for its writes.
func newTestTurnLog() *turnLog {
	cp := &checkpointer{maxBytes: DefaultCheckpointBytes, logs: map[*turnLog]struct{}{},
		wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	return cp.open("s-1", "t-1", "cli", 1)
}

// textOf joins the content of the events, in order.
func textOf(evs []cpEvent) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.Content)
	}
	return b.String()
}

// A batch whose write failed (the database unreachable) is put back, and
// the step's next text is coalesced with it. The put-back text event
// held its text as Content, the next chunk went into its data, and take
// wrote the data alone over the Content: the text before the failure was
// lost from the checkpoint ("b" where "ab" was streamed).
func TestPutBackTextKeptWhenMoreIsStreamed(t *testing.T) {
	l := newTestTurnLog()
	l.stream(0, false, "a")
	l.putBack(l.take()) // the write failed
	l.stream(0, false, "b")
	evs := l.take()
	if got := textOf(evs); got != "ab" {
		t.Fatalf("checkpointed text %q, want %q (events %+v)", got, "ab", evs)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d numbered %d: %+v", i, e.Seq, evs)
		}
	}
}
