package session

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// ctxLine is one message of the scripted provider's /context.
type ctxLine struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []struct {
		ID, Name, Arguments string
	} `json:"tool_calls"`
	ToolCallID string `json:"tool_call_id"`
	Name       string `json:"name"`
}

// contextOf reads the messages a /context turn said.
func contextOf(t *testing.T, content string) []ctxLine {
	t.Helper()
	var out []ctxLine
	for _, l := range strings.Split(content, "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var m ctxLine
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("context line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func roles(ms []ctxLine) string {
	var b []string
	for _, m := range ms {
		b = append(b, m.Role)
	}
	return strings.Join(b, ",")
}

func (h *harness) transcript(id string) []*sessionv1.Message {
	h.t.Helper()
	msgs, err := h.srv.Messages(context.Background(), &sessionv1.MessagesRequest{Principal: operator, SessionId: id, Limit: MaxPageLimit})
	if err != nil {
		h.t.Fatalf("messages: %v", err)
	}
	return msgs.GetMessages()
}

// checkpointed is the message text the session's checkpoint holds.
func (h *harness) checkpointed(id string) string {
	h.t.Helper()
	var text string
	if err := h.pool.QueryRow(context.Background(), `SELECT COALESCE(string_agg(content, '' ORDER BY seq), '')
		FROM checkpoint_events WHERE session_id = $1 AND kind = 'text'`, id).Scan(&text); err != nil {
		h.t.Fatalf("read checkpoint: %v", err)
	}
	return text
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	if _, err := h.pool.Exec(context.Background(), sql, args...); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
}

// The streamed text of a running turn is checkpointed while the turn runs.
// After a crash, recovery puts that text into the transcript once, with
// one interruption marker; the next provider context has the text and not
// the marker.
func TestCrashMidTurnIsRecovered(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	gen := int64(5)
	const prompt = "/say first half\n/sleep 60000\n/say second half"
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: prompt, ClientTurnGeneration: &gen})
	first := []update{rec.next(), rec.next()}
	if got := texts(first, UpdateMessageChunk); strings.Join(got, "") != "first half" {
		t.Fatalf("first chunks %q", got)
	}
	// The client saw the text: within one checkpoint batch it is stored.
	eventually(t, func() error {
		if got := h.checkpointed(id); got != "first half" {
			return fmt.Errorf("checkpoint holds %q", got)
		}
		return nil
	})
	if n := len(h.transcript(id)); n != 1 {
		t.Fatalf("the transcript got the turn's text before the turn ended: %d rows", n)
	}

	h.crash()
	u := rec.next()
	if u.Type != UpdateTurnComplete || u.str("turn_id") != first[0].str("turn_id") || u.str("outcome") != OutcomeCancelled ||
		u.str("content") != "first half" || u.str("stop_reason") != stopInterrupted || u.Params["client_turn_generation"] != float64(5) {
		t.Fatalf("recovery's turn_complete %v", u.Params)
	}
	want := []struct{ role, content string }{{roleUser, prompt}, {roleAssistant, "first half"}, {roleSystem, interruptedMarker}}
	msgs := h.transcript(id)
	if len(msgs) != len(want) {
		t.Fatalf("transcript after recovery %v", msgs)
	}
	for i, w := range want {
		if msgs[i].GetIndex() != int64(i) || msgs[i].GetRole() != w.role || msgs[i].GetContent() != w.content {
			t.Fatalf("transcript row %d: %v, want %+v", i, msgs[i], w)
		}
	}

	resp := h.prompt(alice, id, "/context")
	given := contextOf(t, resp.GetContent())
	if roles(given) != "user,assistant,user" || given[0].Content != prompt || given[1].Content != "first half" || given[2].Content != "/context" {
		t.Fatalf("the provider was given %+v", given)
	}
	if strings.Contains(resp.GetContent(), "interrupted") {
		t.Fatalf("the marker reached the provider: %q", resp.GetContent())
	}

	// Recovery happens once: another restart adds nothing.
	h.restart()
	markers := 0
	for _, m := range h.transcript(id) {
		if m.GetContent() == interruptedMarker {
			markers++
		}
	}
	if markers != 1 || len(h.transcript(id)) != 5 {
		t.Fatalf("%d markers, transcript %v", markers, h.transcript(id))
	}
}

// A tool call running when the process died gets a cancelled result in
// the transcript and in the context, so the provider is never given an
// unanswered call.
func TestCrashDuringToolCallIsRecovered(t *testing.T) {
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}}})
	id := h.newSession(alice, "guarded")
	rec := h.record(id)
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say calling\n/tool echo {\"a\":1}"})
	rec.until(UpdateApprovalRequest)
	h.crash()
	rec.until(UpdateTurnComplete)
	msgs := h.transcript(id)
	if len(msgs) != 4 || msgs[1].GetContent() != "calling" || msgs[2].GetContent() != "echo: "+toolInterruptedOutput || msgs[3].GetContent() != interruptedMarker {
		t.Fatalf("transcript %v", msgs)
	}
	if n := h.count("SELECT count(*) FROM tool_calls WHERE session_id = $1 AND status = 'cancelled'", id); n != 1 {
		t.Fatalf("%d cancelled tool calls", n)
	}
	given := contextOf(t, h.prompt(alice, id, "/context").GetContent())
	if roles(given) != "user,assistant,tool,user" || len(given[1].ToolCalls) != 1 || given[2].Content != toolInterruptedOutput ||
		given[2].ToolCallID != given[1].ToolCalls[0].ID {
		t.Fatalf("the provider was given %+v", given)
	}
}

// Recovery restores only the surfaces it knows: the turn of another
// surface keeps its checkpoint as it was (no transcript rows, no marker),
// stays out of the provider context, and its session cannot be resumed
// from another surface.
func TestRecoveryLeavesOtherSurfacesIntact(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	created, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, InteractionSurface: "channel:test"})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSessionId()
	rec := h.record(id)
	h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say partial\n/sleep 60000"})
	rec.next()
	eventually(t, func() error {
		if got := h.checkpointed(id); got != "partial" {
			return fmt.Errorf("checkpoint holds %q", got)
		}
		return nil
	})
	const rows = "SELECT count(*) FROM checkpoint_events WHERE session_id = $1 AND interaction_surface = 'channel:test'"
	before := h.count(rows, id)

	h.crash()
	if u := rec.next(); u.Type != UpdateTurnComplete || u.str("outcome") != OutcomeCancelled || u.str("content") != "" {
		t.Fatalf("turn_complete %v", u.Params)
	}
	if msgs := h.transcript(id); len(msgs) != 1 || msgs[0].GetRole() != roleUser {
		t.Fatalf("another surface's turn was restored: %v", msgs)
	}
	if n := h.count(rows, id); n != before {
		t.Fatalf("checkpoint rows %d, were %d", n, before)
	}
	if n := h.count("SELECT count(*) FROM turns WHERE session_id = $1 AND state = 'interrupted'", id); n != 1 {
		t.Fatalf("%d interrupted turns", n)
	}

	_, err = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id})
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonConflict, "channel:test")
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id, InteractionSurface: "channel:test"}); err != nil {
		t.Fatalf("resume from its own surface: %v", err)
	}
	if given := contextOf(t, h.prompt(alice, id, "/context").GetContent()); roles(given) != "user" || given[0].Content != "/context" {
		t.Fatalf("the provider was given %+v", given)
	}
	if n := h.count(rows+" AND turn_id = (SELECT turn_id FROM turns WHERE state = 'interrupted' AND session_id = $1)", id); n != before {
		t.Fatalf("the interrupted turn's checkpoint changed: %d rows, were %d", n, before)
	}
}

// Tool calls and results of an earlier turn are in the provider's context
// of the next one.
func TestToolResultsStayInTheContext(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	h.prompt(alice, id, "/say calling\n/tool echo {\"k\":\"v\"}\n/say done")
	given := contextOf(t, h.prompt(alice, id, "/context").GetContent())
	if roles(given) != "user,assistant,tool,assistant,user" {
		t.Fatalf("the provider was given %+v", given)
	}
	call, result := given[1], given[2]
	if call.Content != "calling" || len(call.ToolCalls) != 1 || call.ToolCalls[0].Name != "echo" || call.ToolCalls[0].Arguments != `{"k":"v"}` {
		t.Fatalf("assistant message %+v", call)
	}
	if result.Content != `{"k":"v"}` || result.ToolCallID != call.ToolCalls[0].ID || result.Name != "echo" || given[3].Content != "\ndone" {
		t.Fatalf("tool message %+v, then %+v", result, given[3])
	}
}

// The same with an OpenAI-compatible endpoint: its second turn's request
// carries the first turn's call and result.
func TestOpenAIGivenEarlierToolResults(t *testing.T) {
	fake := &fakeOpenAI{t: t, release: make(chan struct{})}
	close(fake.release)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "gpt", Provider: ProviderOpenAI, BaseURL: srv.URL + "/v1", Model: "m"}})
	id := h.newSession(alice, "gpt")
	h.prompt(alice, id, "first")
	h.prompt(alice, id, "second")
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reqs) < 3 {
		t.Fatalf("%d requests", len(fake.reqs))
	}
	msgs, _ := fake.reqs[2]["messages"].([]any)
	var rs []string
	for _, m := range msgs {
		rs = append(rs, m.(map[string]any)["role"].(string))
	}
	if strings.Join(rs, ",") != "user,assistant,tool,assistant,user" {
		t.Fatalf("second turn's roles %v", rs)
	}
	asst, tool := msgs[1].(map[string]any), msgs[2].(map[string]any)
	calls, _ := asst["tool_calls"].([]any)
	if asst["content"] != "Hello " || len(calls) != 1 || calls[0].(map[string]any)["id"] != "call_abc" ||
		tool["tool_call_id"] != "call_abc" || tool["content"] != `{"q":"hi"}` {
		t.Fatalf("turn 1 as given at turn 2: %v / %v", asst, tool)
	}
}

// Past its budget the retained context loses its oldest turns: the
// transcript does not change, history_trimmed comes only once the new
// snapshot committed, and not at all when that write fails. The snapshot
// holds neither the system prompt nor thoughts.
func TestTrimRetainedContext(t *testing.T) {
	h := newHarness(t)
	// The prompt "/say" and seven words is 14 estimated tokens, its answer
	// 13; a prompt that thinks first, 20. The third turn's context (74)
	// passes 70: the first turn goes.
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "tiny", Provider: ProviderScripted, ContextBudgetTokens: 70, SystemPrompt: "RUNTIME-SYSTEM-PROMPT"}})
	id := h.newSession(alice, "tiny")
	rec := h.record(id)
	const say = "/say aaaa bbbb cccc dddd eeee ffff gggg"
	const answer = "aaaa bbbb cccc dddd eeee ffff gggg"
	h.prompt(alice, id, say)
	h.prompt(alice, id, "/think HIDDEN-REASONING\n"+say)
	rec.until(UpdateTurnComplete)
	if got := types(rec.until(UpdateTurnComplete)); strings.Contains(got, UpdateHistoryTrimmed) {
		t.Fatalf("trimmed within the budget: %s", got)
	}
	before := h.transcript(id)

	// The snapshot write is made slow: the notification must wait for it.
	h.exec(`CREATE FUNCTION slow_snapshot() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.5); RETURN NEW; END $$`)
	h.exec("CREATE TRIGGER slow BEFORE INSERT OR UPDATE ON context_snapshots FOR EACH ROW EXECUTE FUNCTION slow_snapshot()")
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: say})
	u := rec.next()
	var raw []byte
	if err := h.pool.QueryRow(context.Background(), "SELECT messages FROM context_snapshots WHERE session_id = $1", id).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var snap []storedMessage
	if err := json.Unmarshal(raw, &snap); err != nil {
		t.Fatal(err)
	}
	if u.Type != UpdateHistoryTrimmed || u.Params["dropped_messages"] != float64(2) || u.Params["kept_turns"] != float64(2) ||
		u.str("reason") != trimReason || len(snap) != 3 {
		t.Fatalf("first update %s %v with a snapshot of %d messages", u.Type, u.Params, len(snap))
	}
	// The snapshot is the retained messages only: no system prompt, no
	// thought beside the answer.
	if snap[0].Role != roleUser || snap[1].Role != roleAssistant || snap[1].Content != answer || snap[2].Content != say ||
		strings.Contains(string(raw), "RUNTIME-SYSTEM-PROMPT") {
		t.Fatalf("snapshot %s", raw)
	}
	if r := testwait.Recv(t, res); r.err != nil || r.resp.GetContent() != answer {
		t.Fatalf("trimmed turn %v %v", r.resp, r.err)
	}
	rec.until(UpdateTurnComplete)
	h.exec("DROP TRIGGER slow ON context_snapshots")
	// The turn that trimmed records it, for a pane rebuilt from the
	// session to show the notice its followers saw.
	te, err := h.srv.TurnEvents(context.Background(), &sessionv1.TurnEventsRequest{Principal: alice, SessionId: id, TurnIds: []string{u.str("turn_id")}})
	if err != nil || len(te.GetTurns()) != 1 || te.GetTurns()[0].GetTrimmedMessages() != 2 || te.GetTurns()[0].GetTrimmedAt() == nil {
		t.Fatalf("the trimming turn's events: %v %v", te, err)
	}

	after := h.transcript(id)
	for i, m := range before {
		if after[i].GetIndex() != m.GetIndex() || after[i].GetContent() != m.GetContent() || after[i].GetRole() != m.GetRole() {
			t.Fatalf("transcript row %d changed: %v -> %v", i, m, after[i])
		}
	}
	given := contextOf(t, h.prompt(alice, id, "/context").GetContent())
	if roles(given) != "system,user,assistant,user,assistant,user" || given[0].Content != "RUNTIME-SYSTEM-PROMPT" {
		t.Fatalf("the provider was given %+v", given)
	}
	rec.until(UpdateTurnComplete)

	// The snapshot write fails: the turn runs on the untrimmed context and
	// nobody is told of a trim.
	h.exec(`CREATE FUNCTION fail_snapshot() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'snapshot refused by the test'; END $$`)
	h.exec("CREATE TRIGGER fail BEFORE INSERT OR UPDATE ON context_snapshots FOR EACH ROW EXECUTE FUNCTION fail_snapshot()")
	var boundary int64
	snapshot := func() (int64, int) {
		var n int
		if err := h.pool.QueryRow(context.Background(), "SELECT boundary, jsonb_array_length(messages) FROM context_snapshots WHERE session_id = $1",
			id).Scan(&boundary, &n); err != nil {
			t.Fatal(err)
		}
		return boundary, n
	}
	b0, n0 := snapshot()
	if r := h.prompt(alice, id, say); r.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("turn with a failing trim: %v", r)
	}
	if got := types(rec.until(UpdateTurnComplete)); strings.Contains(got, UpdateHistoryTrimmed) {
		t.Fatalf("history_trimmed without a snapshot: %s", got)
	}
	if b, n := snapshot(); b != b0 || n != n0 {
		t.Fatalf("snapshot moved to %d/%d from %d/%d", b, n, b0, n0)
	}
	h.exec("DROP TRIGGER fail ON context_snapshots")
	h.prompt(alice, id, say)
	if got := types(rec.until(UpdateTurnComplete)); !strings.HasPrefix(got, UpdateHistoryTrimmed) {
		t.Fatalf("once the write works the trim happens: %s", got)
	}
}

// An explicitly empty snapshot is authoritative: nothing before its
// boundary is given. A session without a snapshot (made before snapshots
// existed) replays its transcript.
func TestSnapshotAuthority(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	emptied := h.newSession(alice, "default")
	h.prompt(alice, emptied, "/say old words")
	var last int64
	if err := h.pool.QueryRow(ctx, "SELECT max(seq) FROM checkpoint_events WHERE session_id = $1", emptied).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.store.writeSnapshot(ctx, emptied, SurfaceRPC, last, nil, "", 0); err != nil {
		t.Fatal(err)
	}
	if given := contextOf(t, h.prompt(alice, emptied, "/context").GetContent()); roles(given) != "user" {
		t.Fatalf("an empty snapshot was not authoritative: %+v", given)
	}

	legacy := h.newSession(alice, "default")
	h.prompt(alice, legacy, "/say old words\n/tool echo {}")
	h.exec("DELETE FROM context_snapshots WHERE session_id = $1", legacy)
	given := contextOf(t, h.prompt(alice, legacy, "/context").GetContent())
	if roles(given) != "user,assistant,user" || given[1].Content != "old words" {
		t.Fatalf("a session without a snapshot replays its transcript: %+v", given)
	}
}

// Streamed text is written in batches of CheckpointBytes when the
// interval is long: everything but the last partial batch is stored while
// the turn still runs, and the turn's end writes the rest.
func TestCheckpointBatches(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.CheckpointInterval = 1 << 40 })
	id := h.newSession(alice, "default")
	rec := h.record(id)
	words := strings.Repeat("abcdefghijklmno ", 3000)
	text := strings.TrimSuffix(words, " ")
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say " + text + "\n/sleep 60000"})
	for n := 0; n < 3000; n++ {
		rec.next()
	}
	eventually(t, func() error {
		if got := h.checkpointed(id); len(got) < len(text)-DefaultCheckpointBytes {
			return fmt.Errorf("%d of %d bytes checkpointed", len(got), len(text))
		}
		return nil
	})
	rows, err := h.pool.Query(context.Background(), "SELECT length(content) FROM checkpoint_events WHERE session_id = $1 AND kind = 'text'", id)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for rows.Next() {
		var n int
		_ = rows.Scan(&n)
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		if n < DefaultCheckpointBytes {
			t.Fatalf("a batch of %d bytes written before the interval: %v", n, sizes)
		}
	}
	if !strings.HasPrefix(text, h.checkpointed(id)) {
		t.Fatal("the checkpoint is not the text streamed so far")
	}
	if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, res)
	if got := h.checkpointed(id); got != text {
		t.Fatalf("after the turn %d of %d bytes checkpointed", len(got), len(text))
	}
}

// A tool's output is kept to 16 KiB, with a marker, in the transcript, the
// tool call's row and the context; the live update carries it whole.
func TestToolOutputIsCapped(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	big := `{"x":"` + strings.Repeat("y", 40<<10) + `"}`
	h.prompt(alice, id, "/tool echo "+big)
	var live string
	for _, u := range rec.until(UpdateTurnComplete) {
		if u.Type == UpdateToolResult {
			live = u.str("raw_output")
		}
	}
	if live != big {
		t.Fatalf("live tool_result of %d bytes", len(live))
	}
	marker := fmt.Sprintf("[tool output truncated: %d of %d bytes kept]", MaxToolOutputBytes, len(big))
	want := big[:MaxToolOutputBytes] + "\n" + marker
	if msgs := h.transcript(id); msgs[1].GetContent() != "echo: "+want {
		t.Fatalf("transcript's tool row of %d bytes", len(msgs[1].GetContent()))
	}
	var stored string
	if err := h.pool.QueryRow(context.Background(), "SELECT raw_output FROM tool_calls WHERE session_id = $1", id).Scan(&stored); err != nil || stored != want {
		t.Fatalf("stored output of %d bytes (%v)", len(stored), err)
	}
	given := contextOf(t, h.prompt(alice, id, "/context").GetContent())
	if len(given) != 4 || given[2].Role != roleTool || given[2].Content != want {
		t.Fatalf("context %s", roles(given))
	}
}

// A turn that said something, called a tool and said more, interrupted
// by a crash, is recovered in the transcript in the order it streamed:
// the text before the call (in the transcript since the call), the
// call's result, the text after it, the marker; the first text once.
func TestCrashAfterToolCallRecoveredInOrder(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	const prompt = "/say before\n/tool echo {}\n/say after\n/sleep 60000\n/say never"
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: prompt})
	rec.until(UpdateToolResult)
	if u := rec.next(); u.Type != UpdateMessageChunk || u.str("text") != "\nafter" {
		t.Fatalf("the chunk after the tool %v", u.Params)
	}
	eventually(t, func() error {
		if got := h.checkpointed(id); !strings.HasSuffix(got, "\nafter") {
			return fmt.Errorf("checkpoint holds %q", got)
		}
		return nil
	})
	h.crash()
	rec.until(UpdateTurnComplete)
	var got []string
	for _, m := range h.transcript(id) {
		got = append(got, m.GetRole()+": "+m.GetContent())
	}
	want := []string{"user: " + prompt, "assistant: before", "tool: echo: {}", "assistant: \nafter", "system: " + interruptedMarker}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("transcript after recovery\n%q\nwant\n%q", got, want)
	}
}
