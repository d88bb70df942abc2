package session

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/configclient"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A provider endpoint that streams text without end (a model in a loop,
// a broken or hostile server) kept the turn running for good, its reply
// growing in the session service's memory and then in one transcript row
// no page could carry. What a provider streams in one turn is bounded:
// past MaxReplyBytes the stream is cut, and the turn completes with what
// fits, stop_reason max_tokens, as when a model runs out of tokens.
func TestProviderStreamWithoutEndIsCut(t *testing.T) {
	gone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		piece := strings.Repeat("y", 60<<10)
		for {
			if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", piece); err != nil {
				break
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(gone)
				return
			default:
			}
		}
		<-r.Context().Done()
		close(gone)
	}))
	t.Cleanup(srv.Close)
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "gpt", Provider: ProviderOpenAI, BaseURL: srv.URL + "/v1/", Model: "m"}, APIKey: "k"})
	id := h.newSession(alice, "gpt")
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "go on"})
	var r promptResult
	select {
	case r = <-res:
	case <-time.After(60 * time.Second):
		t.Fatal("the turn of a provider streaming without end never ended")
	}
	if r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || r.resp.GetStopReason() != "max_tokens" ||
		len(r.resp.GetContent()) != MaxReplyBytes {
		t.Fatalf("prompt: %v, %d bytes, %v", r.resp.GetStopReason(), len(r.resp.GetContent()), r.err)
	}
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider's stream was never cut")
	}
	msgs, err := h.srv.Messages(context.Background(), &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
	if n := len(msgs.GetMessages()); err != nil || msgs.GetTotal() != 2 || n == 0 || len(msgs.GetMessages()[n-1].GetContent()) != MaxReplyBytes {
		t.Fatalf("transcript: %d of %d messages, %v", len(msgs.GetMessages()), msgs.GetTotal(), err)
	}
}

// The scripted provider says a line back: a 5 MiB line is a reply past
// the bound, cut at it.
func TestReplyPastBoundCut(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: strings.Repeat("é", 5<<19)})
	if err != nil || resp.GetStopReason() != "max_tokens" || len(resp.GetContent()) != MaxReplyBytes {
		t.Fatalf("prompt: %v, %d bytes, %v", resp.GetStopReason(), len(resp.GetContent()), err)
	}
	if streamed := chunkText(rec.until(UpdateTurnComplete)); len(streamed) != MaxReplyBytes {
		t.Fatalf("%d bytes streamed", len(streamed))
	}
}

// chunkText joins the message chunks of updates.
func chunkText(us []update) string {
	var b strings.Builder
	for _, u := range us {
		if u.Type == UpdateMessageChunk {
			b.WriteString(u.str("text"))
		}
	}
	return b.String()
}

// A reply of 2 MiB of control characters is 12 MiB as JSON: its chunk
// and its turn_complete, past the bus's 8 MiB, were refused, and the
// client never saw the turn end. The bound counts the reply as JSON: the
// reply is cut where its JSON reaches it, and every update arrives.
func TestReplyBoundCountsItsJSON(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: strings.Repeat("\x01", 2<<20)})
	if err != nil || resp.GetStopReason() != "max_tokens" || len(resp.GetContent()) != MaxReplyBytes/6 {
		t.Fatalf("prompt: %v, %d bytes, %v", resp.GetStopReason(), len(resp.GetContent()), err)
	}
	us := rec.until(UpdateTurnComplete)
	checkSeq(t, us)
	if got := chunkText(us); got != resp.GetContent() {
		t.Fatalf("%d bytes streamed, the reply is %d", len(got), len(resp.GetContent()))
	}
	if got := us[len(us)-1].str("content"); got != resp.GetContent() {
		t.Fatalf("turn_complete's content: %d bytes", len(got))
	}
}

// The scripted provider takes a tool call's arguments from the prompt, a
// line of up to the 8 MiB frame: a call past provider.MaxToolCallBytes
// fails the turn, before it runs or is announced.
func TestToolCallPastBoundFailsTheTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	prompt := `/tool echo {"x":"` + strings.Repeat("a", 2<<20) + `"}`
	resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: prompt})
	if err != nil || resp.GetOutcome() != outcomeEnum[OutcomeFailed] ||
		!strings.Contains(resp.GetContent(), "the provider asked for tool calls of 2097174 bytes in one step; the limit is 1048576") {
		t.Fatalf("prompt: %v %q %v", resp.GetOutcome(), resp.GetContent(), err)
	}
	if got := types(rec.until(UpdateTurnComplete)); got != "turn_complete" {
		t.Fatalf("updates %s", got)
	}
	var calls int
	if err := h.pool.QueryRow(context.Background(), "SELECT count(*) FROM tool_calls WHERE session_id = $1", id).Scan(&calls); err != nil || calls != 0 {
		t.Fatalf("%d tool calls recorded (%v)", calls, err)
	}
}

// A provider's failure text is the failed turn's content and error, both
// in its turn_complete: 2 MiB of '<' made a 24 MiB update the bus
// refused, and followers never saw the turn end. It is cut where its JSON
// reaches MaxFailureBytes, and says so.
func TestFailureTextBounded(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/fail " + strings.Repeat("<", 2<<20)})
	if err != nil || resp.GetOutcome() != outcomeEnum[OutcomeFailed] {
		t.Fatalf("prompt: %v %v", resp.GetOutcome(), err)
	}
	content := resp.GetContent()
	if len(content) > MaxFailureBytes/6+64 || !strings.HasSuffix(content, " of 2097152 bytes]") {
		t.Fatalf("failure text of %d bytes: …%q", len(content), content[max(0, len(content)-64):])
	}
	us := rec.until(UpdateTurnComplete)
	if end := us[len(us)-1]; end.str("content") != content || end.str("error") != content {
		t.Fatalf("turn_complete %d/%d bytes", len(end.str("content")), len(end.str("error")))
	}
}

// A stop reason a provider gives is passed on when it is a plain word of
// at most MaxStopReasonBytes, else it is "other": a finish_reason of 2 MiB
// of '<' made the completed turn's turn_complete too large for the bus.
func TestProviderStopReasonBounded(t *testing.T) {
	for reason, want := range map[string]string{
		"content_filter":           "content_filter",
		strings.Repeat("<", 2<<20): stopOther,
		strings.Repeat("a", 65):    stopOther,
		"stop\nreason":             stopOther,
		strings.Repeat("a", 64):    strings.Repeat("a", 64),
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":%q}]}\n\ndata: [DONE]\n\n", reason)
		}))
		h := newHarness(t)
		h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "gpt", Provider: ProviderOpenAI, BaseURL: srv.URL + "/v1/", Model: "m"}, APIKey: "k"})
		id := h.newSession(alice, "gpt")
		rec := h.record(id)
		resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
		if err != nil || resp.GetStopReason() != want {
			t.Fatalf("finish_reason of %d bytes: stop_reason %.80q, %v; want %q", len(reason), resp.GetStopReason(), err, want)
		}
		us := rec.until(UpdateTurnComplete)
		if got := us[len(us)-1].str("stop_reason"); got != want {
			t.Fatalf("turn_complete's stop_reason %.80q", got)
		}
		srv.Close()
	}
}

// A call's arguments within provider.MaxToolCallBytes were 12 MiB in its
// tool_call update (raw_input and rawInput, a '<' six bytes each): the
// bus refused it, and the client saw a tool_result for a call it was
// never shown. The update carries them cut where their JSON reaches
// MaxLiveToolInputBytes; the call runs with them whole.
func TestToolCallUpdateInputBounded(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	args := `"` + strings.Repeat("<", 1<<20-64) + `"`
	resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/tool echo " + args})
	if err != nil || resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("prompt: %v %q %v", resp.GetOutcome(), resp.GetContent(), err)
	}
	us := rec.until(UpdateTurnComplete)
	if got := types(us); !strings.Contains(got, "tool_call tool_result") {
		t.Fatalf("updates %s", got)
	}
	for _, u := range us {
		if u.Type != UpdateToolCall {
			continue
		}
		in := u.str("raw_input")
		if !strings.HasPrefix(in, `"<<<`) || !strings.HasSuffix(in, fmt.Sprintf(" of %d bytes shown]", len(args))) || u.str("rawInput") != in {
			t.Fatalf("raw_input of %d bytes: …%q", len(in), in[max(0, len(in)-64):])
		}
	}
	// Arguments that fit are shown as they are, JSON as JSON.
	resp, err = h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: `/tool echo {"a":"<b>"}`})
	if err != nil || resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("prompt: %v %v", resp.GetOutcome(), err)
	}
	for _, u := range rec.until(UpdateTurnComplete) {
		if in, ok := u.Params["raw_input"].(map[string]any); u.Type == UpdateToolCall && (!ok || in["a"] != "<b>") {
			t.Fatalf("raw_input %v", u.Params["raw_input"])
		}
	}
}

// No tool has a name past MaxToolNameBytes: a call naming one fails the
// step, before anything is announced.
func TestToolNamePastBoundFailsTheTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	resp, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: "/tool " + strings.Repeat("n", MaxToolNameBytes+1) + " {}"})
	if err != nil || resp.GetOutcome() != outcomeEnum[OutcomeFailed] ||
		!strings.Contains(resp.GetContent(), fmt.Sprintf("a tool named in %d bytes; the limit is %d", MaxToolNameBytes+1, MaxToolNameBytes)) {
		t.Fatalf("prompt: %v %q %v", resp.GetOutcome(), resp.GetContent(), err)
	}
}

// jsonbSafe agrees with PostgreSQL on which JSON texts jsonb takes.
func TestJSONBSafeAgreesWithPostgreSQL(t *testing.T) {
	h := newHarness(t)
	for _, s := range []string{
		`{"a":"x\u0000y"}`, `"\u0000"`, `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`, `"\udc00\ud800"`,
		`"\ud83d\ude00"`, `"\uD83D\uDE00"`, `"\\u0000"`, `"\\\u0000"`, `"\\\\u0000"`, `"\u0001"`, `{"a":[1,"\n\t\"\/"]}`,
		`"é\u00e9"`, `"\ud800\ud800"`, `"\ud800\udbff"`, `"\ud800\udfff"`, `"\u0030"`, `"x\\"`,
	} {
		var out string
		err := h.pool.QueryRow(context.Background(), "SELECT $1::text::jsonb::text", s).Scan(&out)
		if got := jsonbSafe([]byte(s)); got != (err == nil) {
			t.Errorf("jsonbSafe(%s) = %v; PostgreSQL: %v", s, got, err)
		}
	}
}

// A call whose arguments PostgreSQL's jsonb refuses (\u0000) is recorded
// with them as a string: its row was lost, though the call ran.
func TestToolCallArgumentsJSONBRefusesAreRecorded(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	r := h.prompt(alice, id, `/tool echo {"a":"x\u0000y"}`)
	if r.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("turn %v %q", r.GetOutcome(), r.GetContent())
	}
	var in string
	if err := h.pool.QueryRow(context.Background(), "SELECT raw_input::text FROM tool_calls WHERE session_id = $1", id).Scan(&in); err != nil {
		t.Fatalf("the call's row: %v", err)
	}
	if in != `"{\"a\":\"x\\u0000y\"}"` {
		t.Fatalf("raw_input %s", in)
	}
}
