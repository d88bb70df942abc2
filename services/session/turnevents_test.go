package session

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// shownLine is one TurnEvent as a line: kind, tool name and status, text.
func shownLine(e *sessionv1.TurnEvent) string {
	s := e.GetKind()
	if e.GetName() != "" {
		s += " " + e.GetName()
	}
	if e.GetStatus() != "" {
		s += " " + e.GetStatus()
	}
	return s + " " + fmt.Sprintf("%q", e.GetText())
}

// Every transcript row names the turn that wrote it, its prompt too, and
// TurnEvents gives back what the turn showed as it ran, thoughts
// included, in order, with its end: the durable bridge shows a turn it
// builds again as its followers saw it. Without them a pane built from
// the transcript lost the turn's thoughts, and split its reply.
func TestTurnEventsShowATurnAsItRan(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(operator, "")
	h.prompt(operator, id, "/say before")
	h.prompt(operator, id, "/think weighing\n/say first\n"+`/tool echo { "x": 1 }`+"\n/think again\n/say last")

	tr, err := h.srv.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, AfterIndex: at64(-1), Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	turnOf := map[int]string{}
	for i, m := range tr.GetMessages() {
		rows = append(rows, m.GetRole())
		if m.GetTurnId() == "" {
			t.Fatalf("row %d names no turn: %v", i, m)
		}
		turnOf[i] = m.GetTurnId()
	}
	if got := strings.Join(rows, " "); got != "user assistant user assistant tool assistant" {
		t.Fatalf("rows: %s", got)
	}
	first, second := turnOf[0], turnOf[2]
	if turnOf[1] != first || first == second || turnOf[3] != second || turnOf[4] != second || turnOf[5] != second {
		t.Fatalf("the rows' turns: %v", turnOf)
	}

	resp, err := h.srv.TurnEvents(ctx, &sessionv1.TurnEventsRequest{Principal: operator, SessionId: id, TurnIds: []string{second, "turn_none", first}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTurns()) != 2 || resp.GetTurns()[0].GetTurnId() != second || resp.GetTurns()[1].GetTurnId() != first {
		t.Fatalf("turns: %v", resp)
	}
	turn := resp.GetTurns()[0]
	var lines []string
	for _, e := range turn.GetEvents() {
		lines = append(lines, shownLine(e))
	}
	want := `thought "weighing"|text "first"|tool_call echo "{ \"x\": 1 }"|tool_result echo completed "{\"x\":1}"|thought "again"|text "\nlast"`
	if got := strings.Join(lines, "|"); got != want {
		t.Fatalf("events:\n%s\nwant\n%s", got, want)
	}
	if !turn.GetEnded() || turn.GetContent() != "first\nlast" {
		t.Fatalf("the turn's end: %v %q", turn.GetEnded(), turn.GetContent())
	}

	for _, ids := range [][]string{nil, make([]string, MaxTurnEventsTurns+1), {"a/b"}} {
		for i := range ids {
			if ids[i] == "" {
				ids[i] = fmt.Sprintf("turn_%d", i)
			}
		}
		_, err := h.srv.TurnEvents(ctx, &sessionv1.TurnEventsRequest{Principal: operator, SessionId: id, TurnIds: ids})
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "turn_ids")
	}
	_, err = h.srv.TurnEvents(ctx, &sessionv1.TurnEventsRequest{Principal: alice, SessionId: id, TurnIds: []string{first}})
	if err == nil {
		t.Fatal("another principal read the operator's turns")
	}
}

// A turn whose start trimmed the context but whose events TurnEvents
// leaves out (they pass 4 MiB, or ran before they were kept) is shown
// from its rows by a rebuilt pane, and came back without the trim's
// notice its follower had shown: the trim is the turn's (turns), not its
// events'. TurnEvents now names the trims of the turns it leaves out.
func TestTurnEventsNameTheTrimsOfTurnsLeftOut(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(operator, "")
	h.prompt(operator, id, "/say one")
	h.prompt(operator, id, "/say two")
	tr, err := h.srv.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, AfterIndex: at64(-1), Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	first, second := tr.GetMessages()[0].GetTurnId(), tr.GetMessages()[2].GetTurnId()
	h.exec("UPDATE turns SET trimmed_messages = 7, trimmed_at = now() WHERE turn_id = ANY($1)", []string{first, second})
	h.exec("DELETE FROM checkpoint_events WHERE turn_id = $1", first)

	resp, err := h.srv.TurnEvents(ctx, &sessionv1.TurnEventsRequest{Principal: operator, SessionId: id, TurnIds: []string{first, second, "turn_none", first}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTurns()) != 1 || resp.GetTurns()[0].GetTurnId() != second || resp.GetTurns()[0].GetTrimmedMessages() != 7 {
		t.Fatalf("turns: %v", resp.GetTurns())
	}
	trims := resp.GetTrims()
	if len(trims) != 1 || trims[0].GetTurnId() != first || trims[0].GetTrimmedMessages() != 7 || trims[0].GetTrimmedAt() == nil {
		t.Fatalf("trims of the turns left out: %v", trims)
	}
}

// The events TurnEvents gives of a running turn hold exactly the chunk
// updates up to its covered_seq: a reader applies the updates after it
// on top of them. The checkpoint writer's next batch, written between
// the write TurnEvents makes and its read of the events, was read with
// them where covered_seq did not count it: the durable bridge, rebuilding
// a pane at its start, applied that chunk's update again, and a turn
// streaming across its restart showed "t173 " twice (an e2e failure at
// load 24, TestDurableRunningThoughtsWholeAcrossRestart).
func TestTurnEventsOfARunningTurnHoldWhatTheyCover(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(operator, "")
	rec := h.record(id)
	ctx, cancel := context.WithCancel(context.Background())
	done := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/think a \n/sleep 60000"})
	t.Cleanup(func() { cancel(); <-done })
	first := rec.next()
	if first.Type != UpdateThoughtChunk {
		t.Fatalf("first update: %+v", first)
	}
	ls := h.srv.lookupLive(id)
	turn := ls.running()
	if turn == nil {
		t.Fatal("no running turn")
	}
	// The chunk is published before the turn's log takes it, both under
	// mapMu (emit): once the lock is free the log holds it, and covered_seq
	// can count it. Without this wait, at load, TurnEvents took an empty
	// log and answered covered_seq 0 with no thoughts, rightly.
	turn.mapMu.Lock()
	turn.mapMu.Unlock() //nolint:staticcheck // an empty critical section: the wait is the point

	// In the window, the turn streams its next chunk and the writer
	// writes it, if it can write then.
	hook := func(string) {
		seq := first.Seq + 1
		turn.log.stream(0, true, "b ", seq)
		if h.srv.cp.writeMu.TryLock() {
			h.srv.cp.writeMu.Unlock()
			h.srv.cp.flush()
		}
	}
	turnEventsWritten.Store(&hook)
	resp, err := h.srv.TurnEvents(context.Background(), &sessionv1.TurnEventsRequest{Principal: operator, SessionId: id, TurnIds: []string{turn.id}})
	turnEventsWritten.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTurns()) != 1 {
		t.Fatalf("turns: %v", resp)
	}
	var thoughts strings.Builder
	for _, e := range resp.GetTurns()[0].GetEvents() {
		if e.GetKind() == eventThought {
			thoughts.WriteString(e.GetText())
		}
	}
	if got := thoughts.String(); resp.GetCoveredSeq() != first.Seq || got != "a " {
		t.Fatalf("covered_seq %d (the chunk \"a \" is update %d), thoughts read %q", resp.GetCoveredSeq(), first.Seq, got)
	}
}

// BenchmarkTurnEventsRunningTurn is TurnEvents of a running turn that
// streamed 1,000 thoughts: the time the checkpoint writer waits for it,
// which holds its lock through the read (writeThenRead).
func BenchmarkTurnEventsRunningTurn(b *testing.B) {
	h := newHarness(b)
	id := h.newSession(operator, "")
	rec := h.record(id)
	var script strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&script, "/think t%d \n", i)
	}
	script.WriteString("/sleep 600000")
	ctx, cancel := context.WithCancel(context.Background())
	done := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: script.String()})
	b.Cleanup(func() { cancel(); <-done })
	for range 1000 {
		if u := rec.next(); u.Type != UpdateThoughtChunk {
			b.Fatalf("update: %+v", u)
		}
	}
	turn := h.srv.lookupLive(id).running()
	req := &sessionv1.TurnEventsRequest{Principal: operator, SessionId: id, TurnIds: []string{turn.id}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := h.srv.TurnEvents(context.Background(), req)
		if err != nil || len(resp.GetTurns()) != 1 {
			b.Fatalf("turn events: %v %v", err, resp)
		}
	}
}
