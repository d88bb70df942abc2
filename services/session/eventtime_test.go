package session

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// turnOfSession is the id of the session's newest turn.
func turnOfSession(t testing.TB, h *harness, id string) (turnID, surface string) {
	t.Helper()
	err := h.pool.QueryRow(context.Background(), "SELECT turn_id, interaction_surface FROM turns WHERE session_id = $1 ORDER BY started_at DESC LIMIT 1", id).
		Scan(&turnID, &surface)
	if err != nil {
		t.Fatal(err)
	}
	return turnID, surface
}

// A checkpoint event carries the time it happened, not the time its batch
// was written: a thought streamed, then written a while later (the
// checkpoint interval, or a write held up by the database), reads back
// with the stream's time. Either half of that undone fails here: the log
// not reading the clock as the event is made (the write's time stands
// in), or the insert leaving created_at to the database's default (now()
// at the write).
func TestCheckpointEventKeepsItsTime(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(operator, "")
	h.prompt(operator, id, "/say hello")
	turnID, surface := turnOfSession(t, h, id)

	cp := &checkpointer{maxBytes: DefaultCheckpointBytes, logs: map[*turnLog]struct{}{},
		wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	l := cp.open(id, turnID, surface, 1<<40)
	from := time.Now().Truncate(time.Microsecond)
	l.stream(0, true, "a late thought", 0)
	to := time.Now()
	time.Sleep(300 * time.Millisecond) // the batch waits for its write
	wrote := time.Now()
	if err := insertEvents(ctx, h.pool, l.take()); err != nil {
		t.Fatal(err)
	}

	shown, err := h.srv.store.turnEvents(ctx, id, []string{turnID})
	if err != nil {
		t.Fatal(err)
	}
	ts := shown[turnID]
	if ts == nil || len(ts.Events) == 0 {
		t.Fatalf("the turn's events: %+v", shown)
	}
	e := ts.Events[len(ts.Events)-1]
	if e.GetText() != "a late thought" {
		t.Fatalf("the last event: %v", e)
	}
	if at := e.GetAt().AsTime(); at.Before(from) || at.After(to) {
		t.Fatalf("the thought streamed between %s and %s reads back at %s (written at %s)",
			from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), wrote.Format(time.RFC3339Nano))
	}
}

// insertEventsWithoutTimes is insertEvents as it was before events carried
// their time: no created_at column (the database's now() fills it).
func insertEventsWithoutTimes(ctx context.Context, q querier, c *eventColumns, evs []cpEvent) error {
	c.fill(evs)
	_, err := q.Exec(ctx, `INSERT INTO checkpoint_events
			(session_id, seq, turn_id, step, kind, interaction_surface, content, call_id, tool_call_id, name)
		SELECT u.* FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::text[], $7::text[],
			$8::text[], $9::text[], $10::text[]) AS u(session_id, seq, turn_id, step, kind, interaction_surface, content,
			call_id, tool_call_id, name)
		WHERE EXISTS (SELECT 1 FROM turns t WHERE t.turn_id = u.turn_id AND t.session_id = u.session_id)`,
		c.sid, c.seq, c.turn, c.step, c.kind, c.surface, c.content, c.callID, c.tcID, c.name)
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

// BenchmarkCheckpointWriteTimes is the checkpoint's write path on one
// batch of 100 streamed events (one a running turn, as at 100 sessions),
// made and written to PostgreSQL: "times" with each event's clock read
// and the created_at array column, "no_times" as before (no clock read
// per event, the database's default). Only figures: no assertion on them.
func BenchmarkCheckpointWriteTimes(b *testing.B) {
	h := newHarness(b)
	ctx := context.Background()
	id := h.newSession(operator, "")
	h.prompt(operator, id, "/say hello")
	turnID, surface := turnOfSession(b, h, id)
	const batch = 100
	chunk := "1796357943194065258 "
	seq := int64(1 << 40)
	for _, times := range []bool{true, false} {
		name := "no_times"
		if times {
			name = "times"
		}
		b.Run(name, func(b *testing.B) {
			var cols eventColumns
			evs := make([]cpEvent, batch)
			b.ReportAllocs()
			for b.Loop() {
				for i := range evs {
					evs[i] = cpEvent{SessionID: id, Seq: seq, TurnID: turnID, Kind: eventThought, Surface: surface, Content: chunk}
					if times {
						evs[i].At = time.Now()
					}
					seq++
				}
				var err error
				if times {
					err = cols.insert(ctx, h.pool, evs)
				} else {
					err = insertEventsWithoutTimes(ctx, h.pool, &cols, evs)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
