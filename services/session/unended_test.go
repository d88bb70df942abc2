package session

import (
	"context"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/clawmesh/clawmesh/internal/testenv"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// newEndFailingHarness is a harness whose turn ends a test can make fail:
// a 500 ms unwind bound, which a lock on the turn's row outlasts (failEnd).
func newEndFailingHarness(t *testing.T, tweak ...func(*Config)) *harness {
	return newHarness(t, append([]func(*Config){func(c *Config) { c.UnwindTimeout = 500 * time.Millisecond }}, tweak...)...)
}

// noBatches leaves a turn's checkpoint events to its end: the writer's
// interval an hour.
func noBatches(c *Config) { c.CheckpointInterval = time.Hour }

// keptAnHour keeps idle sessions in memory until a test evicts them.
func keptAnHour(c *Config) { c.LiveIdleTimeout = time.Hour }

// completedUnrecorded runs "/say first … /say last" in session id while
// its end's write fails, checks the case (its clients told completed,
// end_turn, "first\nlast") and returns the turn's id.
func (h *harness) completedUnrecorded(id string) string {
	h.t.Helper()
	done := h.failEnd(UpdateMessageChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say first\n/sleep 1500\n/say last"}, false)
	if done.Params["outcome"] != OutcomeCompleted || done.Params["stop_reason"] != stopEndTurn || done.Params["content"] != "first\nlast" {
		h.t.Fatalf("the case: turn_complete %v, want completed, end_turn, its reply", done.Params)
	}
	turnID, _ := done.Params["turn_id"].(string)
	return turnID
}

// cutUnrecorded cuts a turn of session id after its first thought while
// its end's write fails, and returns the turn's id.
func (h *harness) cutUnrecorded(id string) string {
	h.t.Helper()
	done := h.failEnd(UpdateThoughtChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/think cut\n/sleep 2000\n/say never"}, true)
	turnID, _ := done.Params["turn_id"].(string)
	return turnID
}

// lockTurns locks the rows of turns where sessionCol (session_id or
// turn_id) is id, until the returned release is called (or the test
// ends).
func (h *harness) lockTurns(sessionCol, id string) (release func()) {
	t := h.t
	t.Helper()
	ctx := context.Background()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "SELECT 1 FROM turns WHERE "+pgx.Identifier{sessionCol}.Sanitize()+" = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// promptNext runs "/say next" in session id, which writes its ends kept.
func (h *harness) promptNext(id string) {
	h.t.Helper()
	if r := h.prompt(operator, id, "/say next"); r.GetContent() != "next" {
		h.t.Fatalf("the next prompt: %v", r)
	}
}

// evictAll runs the eviction sweep two idle timeouts on and returns how
// many sessions it evicted.
func (h *harness) evictAll() int { return h.srv.evictIdle(time.Now().Add(2 * time.Hour)) }

// spoolDir is where the harness's service spools turn ends.
func (h *harness) spoolDir() string { return filepath.Join(h.dataDir, "unended") }

// spooled lists the spool's files.
func (h *harness) spooled() []string {
	h.t.Helper()
	des, err := os.ReadDir(h.spoolDir())
	if err != nil {
		h.t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	sort.Strings(names)
	return names
}

// A turn that completed while its end's write failed (its row locked past
// the unwind bound) published turn_complete completed, end_turn, with its
// reply. The next admission ended it as recovery ends a turn: cancelled,
// interrupted, its reply only what the checkpoint writer had stored
// before (nothing here: its batches wait an hour), so the store said
// otherwise than its clients were told, and session/load and the bridge's
// replay lacked its last chunks. It is now written as it ended.
func TestUnrecordedEndIsWrittenAsItEnded(t *testing.T) {
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	turnID := h.completedUnrecorded(id)
	h.promptNext(id)
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
	if left := h.spooled(); len(left) != 0 {
		t.Fatalf("the spool holds %v once the end is written", left)
	}
}

// crashThenEndedAsTold kills the service (crash) after turn turnID of
// session id completed, "first\nlast", with its end not written, and
// checks that the start wrote it as its clients were told, publishing
// no second end.
func (h *harness) crashThenEndedAsTold(id, turnID string) {
	h.t.Helper()
	rec := h.record(id)
	h.crash()
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
	rec.quiet(200 * time.Millisecond)
}

// endedAsTold checks that turn turnID of session id is stored as its
// turn_complete said it ended: its outcome, stop reason and reply, the
// reply in its checkpoint events and in the transcript, and no
// interruption marker.
func (h *harness) endedAsTold(id, turnID, outcome, stop, reply string) {
	t := h.t
	t.Helper()
	var state, gotOutcome, gotStop, content string
	if err := h.pool.QueryRow(context.Background(), "SELECT state, outcome, stop_reason, content FROM turns WHERE turn_id = $1", turnID).
		Scan(&state, &gotOutcome, &gotStop, &content); err != nil {
		t.Fatal(err)
	}
	if state != turnDone || gotOutcome != outcome || gotStop != stop || content != reply {
		t.Errorf("the turn reads %s, %s, %s, %q; its clients were told %s, %s, %q", state, gotOutcome, gotStop, content, outcome, stop, reply)
	}
	var events string
	if err := h.pool.QueryRow(context.Background(), `SELECT COALESCE(string_agg(content, '' ORDER BY seq), '')
		FROM checkpoint_events WHERE turn_id = $1 AND kind = 'text'`, turnID).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != reply {
		t.Errorf("the turn's checkpoint events hold %q, want %q", events, reply)
	}
	want := 1
	if reply == "" {
		want = 0
	}
	if n := h.count("SELECT count(*) FROM messages WHERE turn_id = $1 AND role = 'assistant'", turnID); n != want {
		t.Errorf("%d transcript rows of the turn's reply, want %d", n, want)
	} else if n := h.count("SELECT count(*) FROM messages WHERE turn_id = $1 AND role = 'assistant' AND content = $2", turnID, reply); n != want {
		t.Errorf("the transcript's row of the turn's reply is not %q", reply)
	}
	if n := h.count("SELECT count(*) FROM messages WHERE session_id = $1 AND content = $2", id, interruptedMarker); n != 0 {
		t.Errorf("%d interruption markers in the transcript", n)
	}
	if n := h.count("SELECT count(*) FROM sessions WHERE session_id = $1 AND state = 'idle'", id); n != 1 {
		t.Error("the session's row does not read idle")
	}
}

// The same completed turn with an idempotency key: its message delivered
// again ran it again (resumed, as a cut turn is), where the turn had
// completed and its sender been told so. It is answered with the turn.
func TestKeyedPromptAfterAnUnrecordedCompletedEnd(t *testing.T) {
	h := newEndFailingHarness(t)
	ctx := context.Background()
	id := h.channelSession("chan_unrecorded_done")
	const text = "/tool echo {\"pay\":7}\n/sleep 1500\n/say done"
	h.failEnd(UpdateToolResult, &sessionv1.PromptRequest{Principal: chanOperator, SessionId: id, Prompt: text, IdempotencyKey: "msg-7"}, false)

	again, err := h.keyedPrompt(ctx, id, "msg-7", text)
	if err != nil || !again.GetReplayed() || again.GetOutcome() != outcomeEnum[OutcomeCompleted] || again.GetContent() != "done" {
		t.Fatalf("the delivery again: %v %v, want the completed turn replayed", again, err)
	}
	if n := h.echoRuns(id, `{"pay":7}`); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// A turn without a key whose end's write failed, its session then left
// idle until its in-memory half was evicted: nothing ended it before the
// service's next start, and its row and its session's read running to
// the session list and the bridge meanwhile. Eviction ends it now.
func TestEvictionEndsATurnWhoseEndWasNotRecorded(t *testing.T) {
	h := newEndFailingHarness(t, keptAnHour)
	id := h.newSession(operator, "default")
	turnID := h.cutUnrecorded(id)

	if n := h.evictAll(); n != 1 {
		t.Fatalf("%d sessions evicted, want 1", n)
	}
	if n := h.count("SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'running'", id); n != 0 {
		t.Fatalf("%d turns still running in the store after the session's eviction", n)
	}
	h.endedAsTold(id, turnID, OutcomeCancelled, stopCancelled, "")
}

// While the store still refuses the end, eviction keeps the session in
// memory, and the end with it, for the next sweep.
func TestEvictionKeepsAnEndTheStoreRefuses(t *testing.T) {
	h := newEndFailingHarness(t, keptAnHour)
	id := h.newSession(operator, "default")
	turnID := h.cutUnrecorded(id)

	release := h.lockTurns("turn_id", turnID)
	if n := h.evictAll(); n != 0 {
		t.Fatalf("%d sessions evicted while their turn's end could not be written, want 0", n)
	}
	release()
	if n := h.evictAll(); n != 1 {
		t.Fatalf("%d sessions evicted at the next sweep, want 1", n)
	}
	h.endedAsTold(id, turnID, OutcomeCancelled, stopCancelled, "")
}

// A stop of the service before the session's next admission writes the
// end too; its start then finds nothing to recover, and publishes no
// second turn_complete.
func TestShutdownWritesAnEndNotRecorded(t *testing.T) {
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	turnID := h.completedUnrecorded(id)

	rec := h.record(id)
	h.restart()
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
	rec.quiet(200 * time.Millisecond)
}

// A crash (the process killed, nothing of it run after) between the
// failed write and the session's next admission lost what was kept: the
// next start recorded the turn as recovery records one (cancelled,
// interrupted, its reply missing) and published a second turn_complete,
// though its clients had been told it completed. The spool carries it
// across: the start writes it as it ended, and publishes nothing.
func TestAnEndNotRecordedOutlivesACrash(t *testing.T) {
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	turnID := h.completedUnrecorded(id)

	h.crashThenEndedAsTold(id, turnID)
	if left := h.spooled(); len(left) != 0 {
		t.Fatalf("the spool holds %v once the start wrote it", left)
	}
}

// The bound that was said to end a ninth end not written in a session
// the old way is never reached: a session holds one at most, its next
// admission writing it before a turn starts, or refused while the store
// refuses it. Nine failed ends in a row, and one more prompt refused
// while the ninth cannot be written: each turn is written as it ended.
func TestEveryUnrecordedEndOfASessionIsWrittenAsItEnded(t *testing.T) {
	defer func(d time.Duration) { admitTimeout = d }(admitTimeout)
	admitTimeout = time.Second
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	held := func() int {
		h.srv.mu.Lock()
		ls := h.srv.lives[id]
		h.srv.mu.Unlock()
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return len(ls.unended)
	}
	var turns []string
	for range 9 {
		turns = append(turns, h.completedUnrecorded(id))
		if n := held(); n != 1 {
			t.Fatalf("after %d failed ends the session holds %d, want 1", len(turns), n)
		}
	}
	release := h.lockTurns("session_id", id)
	if _, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say refused"}); err == nil {
		t.Fatal("a turn started while the session's last end could not be written")
	}
	if n := held(); n != 1 {
		t.Fatalf("after a refused admission the session holds %d, want 1", n)
	}
	release()
	h.promptNext(id)
	for _, turnID := range turns {
		h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
	}
}

// Past the bound on what the process keeps in memory of ends not
// written, a turn's end was not kept: the next admission ended it as
// recovery ends one. The spool keeps it now, and it is written as it
// ended; the bound's count is as it was.
func TestUnrecordedEndPastTheMemoryBoundIsWrittenFromTheSpool(t *testing.T) {
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	h.srv.unendedBytes.Store(maxUnendedBytes)
	turnID := h.completedUnrecorded(id)
	if got := h.spooled(); len(got) != 1 || got[0] != turnID+spoolExt {
		t.Fatalf("the spool holds %v, want the turn's end", got)
	}

	h.promptNext(id)
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, "first\nlast")
	if n := h.srv.unendedBytes.Load(); n != maxUnendedBytes {
		t.Fatalf("the bound's count is %d, want %d", n, maxUnendedBytes)
	}
	if left := h.spooled(); len(left) != 0 {
		t.Fatalf("the spool holds %v once the end is written", left)
	}
}

// Past both bounds (memory and the spool's), the end is not kept: the
// turn is recorded as recovery records one, and the log says what its
// clients were told.
func TestUnrecordedEndPastBothBoundsIsLoggedAndRecovered(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h := newEndFailingHarness(t, noBatches, func(c *Config) { c.Log = zap.New(zapcore.NewTee(core, testenv.Logger(t).Core())) })
	id := h.newSession(operator, "default")
	h.srv.unendedBytes.Store(maxUnendedBytes)
	h.srv.spool.mu.Lock()
	h.srv.spool.total = maxSpooledBytes
	h.srv.spool.mu.Unlock()
	turnID := h.completedUnrecorded(id)
	if got := h.spooled(); len(got) != 0 {
		t.Fatalf("the spool holds %v past its bound", got)
	}

	h.promptNext(id)
	if n := h.count("SELECT count(*) FROM turns WHERE turn_id = $1 AND state = 'done' AND stop_reason = $2", turnID, stopInterrupted); n != 1 {
		t.Fatal("the turn not kept was not ended as recovery ends one")
	}
	lost := logs.FilterMessage("turn end lost: recorded as recovery records one, cancelled, interrupted").All()
	if len(lost) != 1 {
		t.Fatalf("%d logs of the end lost, want 1", len(lost))
	}
	if f := lost[0].ContextMap(); f["turn_id"] != turnID || f["told_outcome"] != OutcomeCompleted || f["told_content_bytes"] != int64(len("first\nlast")) {
		t.Fatalf("the end lost is logged as %v", f)
	}
	if n := h.srv.unendedBytes.Load(); n != maxUnendedBytes {
		t.Fatalf("the bound's count is %d, want %d", n, maxUnendedBytes)
	}
}

// A file in the spool that is not a turn end this build wrote (another
// format, another version, a body its digest does not match, a name not
// its turn's, not JSON) is refused at the start, set aside with a log,
// never written; a real end beside them is written as it ended, and what
// a write cut by a crash left is removed.
func TestASpoolFileNotOursIsRefused(t *testing.T) {
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	turnID := h.completedUnrecorded(id)

	real, err := os.ReadFile(filepath.Join(h.spoolDir(), turnID+spoolExt))
	if err != nil {
		t.Fatal(err)
	}
	head, body, _ := strings.Cut(string(real), "\n")
	bad := map[string]string{
		"turn_other_format.end":     `{"format":"something.else","version":1,"sha256":""}` + "\n{}",
		"turn_later.end":            `{"format":"` + spoolFormat + `","version":3,"sha256":""}` + "\n{}",
		"turn_tampered.end":         head + "\n" + body[:len(body)-1] + " }",
		"turn_not_its_name.end":     string(real),
		"turn_not_json.end":         "\x00\x01 not a turn end",
		"not a turn id!.end":        string(real),
		"turn_no_header_at_all.end": "{}",
	}
	for name, data := range bad {
		if err := os.WriteFile(filepath.Join(h.spoolDir(), name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A FIFO would hold the start in its open until a writer came, and a
	// link would be read as the file it names: neither is a turn end.
	odd := []string{"turn_a_fifo.end", "turn_a_link.end"}
	if err := unix.Mkfifo(filepath.Join(h.spoolDir(), odd[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(turnID+spoolExt, filepath.Join(h.spoolDir(), odd[1])); err != nil {
		t.Fatal(err)
	}
	cut := "." + turnID + spoolExt + ".123"
	if err := os.WriteFile(filepath.Join(h.spoolDir(), cut), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}

	h.crashThenEndedAsTold(id, turnID)
	var want []string
	for name := range bad {
		want = append(want, name+refusedExt)
	}
	for _, name := range odd {
		want = append(want, name+refusedExt)
	}
	sort.Strings(want)
	if got := h.spooled(); !slices.Equal(got, want) {
		t.Fatalf("the spool holds %v after the start, want %v", got, want)
	}
}
