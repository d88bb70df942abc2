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
