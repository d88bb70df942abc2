package session

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
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
	l.stream(0, false, "a", 0)
	l.putBack(l.take()) // the write failed
	l.stream(0, false, "b", 0)
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
			l.stream(rng.IntN(2), rng.IntN(4) == 0, text, 0)
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
			l.stream(0, false, chunk, 0)
		}
		if evs := l.take(); len(evs) != 1 || len(evs[0].Content) != perBatch*len(chunk) {
			b.Fatalf("batch %+v", evs)
		}
	}
}

// A mark made while no event of the turn is pending (a tool call's, its
// approval request's: their event was written before they were
// published) wakes the writer, whose next batch takes it alone, for the
// turn's last event; one made while an event is pending rides with it.
func TestALoneMarkWakesTheWriter(t *testing.T) {
	l := newTestTurnLog()
	l.stream(0, false, "said", 1)
	call := l.add(cpEvent{Step: 0, Kind: eventToolCall, Content: "{}"})
	if evs := l.take(); len(evs) != 2 || len(evs[1].Marks) != 24 {
		t.Fatalf("batch %+v", evs)
	}
	select {
	case <-l.cp.wake:
	default:
	}
	l.mark(2, call, markTool)
	select {
	case <-l.cp.wake:
	default:
		t.Fatal("a mark with no event pending did not wake the writer")
	}
	l.mark(3, call, markApproval)
	ev, m := l.takeLoneMarks()
	if ev != call || fmt.Sprint(unpackMarks(m)) != fmt.Sprint([]int64{2, call, markTool, 3, call, markApproval}) {
		t.Fatalf("lone marks %v for event %d, want the call's two, for event %d", unpackMarks(m), ev, call)
	}
	if ev, m := l.takeLoneMarks(); m != nil {
		t.Fatalf("lone marks taken twice: %v for %d", unpackMarks(m), ev)
	}
	l.stream(1, false, "more", 4)
	l.mark(5, call, markTool)
	if _, m := l.takeLoneMarks(); m != nil {
		t.Fatalf("marks taken alone while an event is pending: %v", unpackMarks(m))
	}
}

// A batch the database could not take goes back to every turn's log,
// each its own events in order, ahead of what was streamed since. The
// writer lays batches out in slices it keeps and clears for the next
// (gather, release): what is put back must be the events, not slices
// of what was cleared.
func TestFlushPutsEveryTurnsBatchBackWhenTheDatabaseIsDown(t *testing.T) {
	db, err := pgxpool.New(context.Background(), "postgres://clawmesh@127.0.0.1:1/clawmesh?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cp := &checkpointer{db: db, log: zap.NewNop(), maxBytes: DefaultCheckpointBytes, timeout: 5 * time.Second,
		logs: map[*turnLog]struct{}{}, wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	var logs []*turnLog
	want := map[*turnLog]string{}
	for i := range 5 {
		l := cp.open("s_"+strconv.Itoa(i), "t_"+strconv.Itoa(i), "cli", 1)
		logs = append(logs, l)
		for k := range 3 {
			text := strconv.Itoa(i) + "." + strconv.Itoa(k) + " "
			l.stream(0, false, text, 0)
			want[l] += text
		}
		l.add(cpEvent{Step: 0, Kind: eventToolCall, Content: "tool " + strconv.Itoa(i)})
		want[l] += "tool " + strconv.Itoa(i)
	}
	cp.flush() // fails: nothing listens on port 1
	cp.flush() // and again, with the batch put back
	for i, l := range logs {
		l.stream(1, false, "after", 0)
		evs := l.take()
		if got := textOf(evs); got != want[l]+"after" {
			t.Fatalf("turn %d: pending after failed writes %q, want %q", i, got, want[l]+"after")
		}
		for _, e := range evs {
			if e.SessionID != l.sessionID || e.TurnID != l.turnID {
				t.Fatalf("turn %d holds an event of another: %+v", i, e)
			}
		}
	}
}

// The slices the writer keeps between batches hold nothing of the last
// batch once it is written: no turn, no event's text, no column's
// string, however many events a retry laid out after it.
func TestWriterKeepsNoTextBetweenBatches(t *testing.T) {
	cp := &checkpointer{maxBytes: DefaultCheckpointBytes, logs: map[*turnLog]struct{}{},
		wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	for i := range 10 {
		l := cp.open("s_"+strconv.Itoa(i), "t_"+strconv.Itoa(i), "cli", 1)
		l.stream(0, false, "text of "+strconv.Itoa(i), 0)
		l.add(cpEvent{Kind: eventToolResult, Content: "output of " + strconv.Itoa(i)})
	}
	cp.writeMu.Lock()
	logs, all := cp.gather()
	if len(logs) != 10 || len(all) != 20 {
		t.Fatalf("gathered %d turns and %d events, want 10 and 20", len(logs), len(all))
	}
	cp.cols.fill(all)
	cp.cols.fill(all[:2]) // a turn retried alone
	cp.release()
	cp.writeMu.Unlock()
	if slices.ContainsFunc(cp.running[:cap(cp.running)], func(l *turnLog) bool { return l != nil }) {
		t.Error("the writer still holds a turn")
	}
	if slices.ContainsFunc(cp.events[:cap(cp.events)], func(e cpEvent) bool { return !reflect.ValueOf(e).IsZero() }) {
		t.Error("the writer still holds an event")
	}
	if slices.ContainsFunc(cp.cols.marks[:cap(cp.cols.marks)], func(b []byte) bool { return b != nil }) {
		t.Error("the writer still holds an event's marks")
	}
	for _, col := range [][]string{cp.cols.sid, cp.cols.turn, cp.cols.kind, cp.cols.surface, cp.cols.content, cp.cols.callID, cp.cols.tcID, cp.cols.name} {
		if slices.ContainsFunc(col[:cap(col)], func(s string) bool { return s != "" }) {
			t.Fatalf("a column still holds a string: %q", col[:cap(col)])
		}
	}
}
