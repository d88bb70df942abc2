package session

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// fakeOpenAI speaks the streaming chat completions format. Its first
// answer streams a thought, text, and a tool call whose arguments arrive
// in pieces, pausing after the first piece of text until release is
// closed; once it sees the tool's result it answers with text.
type fakeOpenAI struct {
	t       *testing.T
	release chan struct{}
	mu      sync.Mutex
	reqs    []map[string]any
	auth    []string
}

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, body)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	msgs, _ := body["messages"].([]any)
	last, _ := msgs[len(msgs)-1].(map[string]any)

	w.Header().Set("Content-Type", "text/event-stream")
	send := func(v string) {
		fmt.Fprintf(w, "data: %s\n\n", v)
		w.(http.Flusher).Flush()
	}
	if last["role"] == "tool" {
		send(`{"choices":[{"index":0,"delta":{"role":"assistant","content":"done"},"finish_reason":null}]}`)
		send(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
		send("[DONE]")
		return
	}
	fmt.Fprint(w, ": keep-alive comment\n\n")
	send(`{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"thinking"},"finish_reason":null}]}`)
	send(`{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`)
	select {
	case <-f.release:
	case <-r.Context().Done():
		return
	}
	send(`{"choices":[{"index":0,"delta":{"content":"lo "},"finish_reason":null}]}`)
	send(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"echo","arguments":""}}]},"finish_reason":null}]}`)
	send(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\":"}}]},"finish_reason":null}]}`)
	send(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"hi\"}"}}]},"finish_reason":null}]}`)
	send(`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
	send("[DONE]")
}

// The openai provider against a local server: text and thinking stream
// as they arrive, a streamed tool call runs and its result goes back with
// the provider's call id, and the second answer ends the turn.
func TestOpenAIProvider(t *testing.T) {
	fake := &fakeOpenAI{t: t, release: make(chan struct{})}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "gpt", Provider: ProviderOpenAI, BaseURL: srv.URL + "/v1/", Model: "test-model", SystemPrompt: "be brief"}, APIKey: "sk-test"})
	id := h.newSession(alice, "gpt")
	rec := h.record(id)
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "say hello and echo hi"})

	first := []update{rec.next(), rec.next()}
	if first[0].Type != UpdateThoughtChunk || first[0].str("text") != "thinking" || first[1].Type != UpdateMessageChunk || first[1].str("text") != "Hel" {
		t.Fatalf("first updates %v", first)
	}
	select {
	case r := <-res:
		t.Fatalf("turn ended before the provider finished: %v", r.resp)
	default:
	}
	close(fake.release)
	us := append(first, rec.until(UpdateTurnComplete)...)
	checkSeq(t, us)
	if got := types(us); got != "agent_thought_chunk agent_message_chunk agent_message_chunk tool_call tool_result agent_message_chunk turn_complete" {
		t.Fatalf("updates %s", got)
	}
	if in, _ := us[3].Params["raw_input"].(map[string]any); us[3].str("name") != "echo" || in["q"] != "hi" {
		t.Fatalf("tool_call %v", us[3].Params)
	}
	if us[4].str("raw_output") != `{"q":"hi"}` {
		t.Fatalf("tool_result %v", us[4].Params)
	}
	r := testwait.Recv(t, res)
	if r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || r.resp.GetContent() != "Hello done" {
		t.Fatalf("prompt %v %v", r.resp, r.err)
	}

	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.reqs) != 2 || fake.auth[0] != "Bearer sk-test" {
		t.Fatalf("%d requests, auth %q", len(fake.reqs), fake.auth)
	}
	req0 := fake.reqs[0]
	tools, _ := req0["tools"].([]any)
	if req0["model"] != "test-model" || req0["stream"] != true || len(tools) == 0 {
		t.Fatalf("first request %v", req0)
	}
	msgs, _ := fake.reqs[1]["messages"].([]any)
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.(map[string]any)["role"].(string))
	}
	if strings.Join(roles, ",") != "system,user,assistant,tool" {
		t.Fatalf("second request's roles %v", roles)
	}
	asst, tool := msgs[2].(map[string]any), msgs[3].(map[string]any)
	calls, _ := asst["tool_calls"].([]any)
	if len(calls) != 1 || calls[0].(map[string]any)["id"] != "call_abc" || tool["tool_call_id"] != "call_abc" || tool["content"] != `{"q":"hi"}` {
		t.Fatalf("tool round trip: %v / %v", asst, tool)
	}
}

// Errors and timeouts of the endpoint end the turn failed with a clear
// message; a cancel mid-stream ends it cancelled.
func TestOpenAIProviderFailures(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/denied/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`)
	})
	hang := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
	mux.HandleFunc("/hang/chat/completions", hang)
	mux.HandleFunc("/short/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut\"}}]}\n\n")
	})
	mux.HandleFunc("/garbage/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: {not json\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	h := newHarness(t)
	agent := func(alias, path string, timeout time.Duration) string {
		h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: alias, Provider: ProviderOpenAI, BaseURL: srv.URL + path, Model: "m", Timeout: timeout}})
		return h.newSession(alice, alias)
	}

	cases := []struct{ alias, path, want string }{
		{"denied", "/denied", "openai provider: HTTP 401: Incorrect API key provided"},
		{"slow", "/hang", "openai provider: no response from " + srv.URL + "/hang/chat/completions within 300ms"},
		{"short", "/short", "openai provider: the stream ended before the response was complete"},
		{"garbage", "/garbage", "openai provider: malformed stream event"},
		{"nobody", "/x", "openai provider: request to"},
	}
	for _, tc := range cases {
		t.Run(tc.alias, func(t *testing.T) {
			id := agent(tc.alias, tc.path, 300*time.Millisecond)
			if tc.alias == "nobody" {
				h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: tc.alias, Provider: ProviderOpenAI, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}})
			}
			rec := h.record(id)
			resp := h.prompt(alice, id, "hi")
			if resp.GetOutcome() != outcomeEnum[OutcomeFailed] || !strings.HasPrefix(resp.GetContent(), tc.want) {
				t.Fatalf("prompt %v, want failed %q", resp, tc.want)
			}
			us := rec.until(UpdateTurnComplete)
			if last := us[len(us)-1]; last.str("outcome") != OutcomeFailed || last.str("error") != resp.GetContent() {
				t.Fatalf("turn_complete %v", last.Params)
			}
		})
	}
	t.Run("no model", func(t *testing.T) {
		h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "unset", Provider: ProviderOpenAI}})
		id := h.newSession(alice, "unset")
		if resp := h.prompt(alice, id, "hi"); resp.GetOutcome() != outcomeEnum[OutcomeFailed] || !strings.Contains(resp.GetContent(), "agents.unset.model is not set") {
			t.Fatalf("prompt %v", resp)
		}
	})
	t.Run("cancel mid-stream", func(t *testing.T) {
		id := agent("patient", "/hang", time.Minute)
		rec := h.record(id)
		res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
		if u := rec.next(); u.str("text") != "partial" {
			t.Fatalf("first update %v", u.Params)
		}
		if _, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); err != nil {
			t.Fatal(err)
		}
		if r := testwait.Recv(t, res); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] || r.resp.GetContent() != "partial" {
			t.Fatalf("prompt %v %v", r.resp, r.err)
		}
	})
}

// A provider that answers, streams a little, then sends only keep-alive
// comments is idle never (each byte resets the idle timeout), and held
// its turn for good. The step's own deadline ends the turn failed, naming
// the setting, and the endpoint's request is cancelled.
func TestOpenAIKeepAlivesAloneEndAtTheStepDeadline(t *testing.T) {
	var cancelled sync.WaitGroup
	cancelled.Add(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer cancelled.Done()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"thinking\"}}]}\n\n")
		w.(http.Flusher).Flush()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				fmt.Fprint(w, ": still here\n\n")
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(srv.Close)
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "chatty", Provider: ProviderOpenAI, BaseURL: srv.URL + "/v1",
		Model: "m", Timeout: 200 * time.Millisecond, StepTimeout: 800 * time.Millisecond}})
	id := h.newSession(alice, "chatty")
	rec := h.record(id)
	resp := h.prompt(alice, id, "hi")
	want := "the provider did not finish its step within 800ms (agents.chatty.step_timeout_secs)"
	if resp.GetOutcome() != outcomeEnum[OutcomeFailed] || resp.GetContent() != want {
		t.Fatalf("prompt %v, want failed %q", resp, want)
	}
	if us := rec.until(UpdateTurnComplete); us[0].str("text") != "thinking" || us[len(us)-1].str("error") != want {
		t.Fatalf("updates %v", us)
	}
	cancelled.Wait() // the request to the endpoint was let go
}
