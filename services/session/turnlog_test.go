package session

import (
	"math/rand/v2"
	"strconv"
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

// The slots and text buffers a turn's log keeps from one batch to the
// next never change a batch taken before, nor mix the events of one
// batch into another's: over a run of streamed text (two steps, text and
// thoughts, chunks past the kept buffer's bound), tool events, takes and
// failed writes put back, the events written, in order, are what was
// streamed and added, each numbered once.
func TestTurnLogBatchesIntact(t *testing.T) {
	l := newTestTurnLog()
	rng := rand.New(rand.NewPCG(1, 2))
	var want, got strings.Builder
	var written []cpEvent
	for i := range 5000 {
		switch r := rng.IntN(40); {
		case r < 30:
			text := strconv.Itoa(i) + " "
			if rng.IntN(100) == 0 {
				text = strings.Repeat("x", maxKeptStreamBuffer+rng.IntN(100)) + text
			}
			l.stream(rng.IntN(2), rng.IntN(4) == 0, text)
			want.WriteString(text)
		case r < 33:
			content := "tool " + strconv.Itoa(i) + " "
			l.add(cpEvent{Step: 1, Kind: eventToolCall, Content: content})
			want.WriteString(content)
		case r < 36:
			l.putBack(l.take()) // a failed write
		default:
			written = append(written, l.take()...)
		}
	}
	written = append(written, l.take()...)
	for i, e := range written {
		if i > 0 && e.Seq <= written[i-1].Seq {
			t.Fatalf("event %d numbered %d after %d", i, e.Seq, written[i-1].Seq)
		}
		got.WriteString(e.Content)
	}
	if got.String() != want.String() {
		t.Fatalf("written text differs from what was streamed: %d bytes against %d", got.Len(), want.Len())
	}
}

// BenchmarkTurnLogStream streams a turn's chunks into its log as the
// turn-stream benchmark's provider does (20-byte chunks), 20 of them
// and then a take, as the writer takes a batch every 100 ms of a stream
// of one chunk each 5 ms: one op is one batch of 20 chunks.
func BenchmarkTurnLogStream(b *testing.B) {
	l := newTestTurnLog()
	const perBatch = 20
	chunk := "1796357943194065258 "
	b.ReportAllocs()
	for b.Loop() {
		for range perBatch {
			l.stream(0, false, chunk)
		}
		if evs := l.take(); len(evs) != 1 || len(evs[0].Content) != perBatch*len(chunk) {
			b.Fatalf("batch %+v", evs)
		}
	}
}
