package provider

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The provider reads the stream as the SSE standard says: a delta whose
// JSON spans several data lines, CRLF and CR line ends, a BOM, comments
// and an id field all reach the turn as the server meant them.
func TestOpenAIReadsStandardEventStreams(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "\xEF\xBB\xBF: hello\r\n\r\n")
		fmt.Fprint(w, "id: 1\r\ndata: {\"choices\":[{\"index\":0,\r\ndata:  \"delta\":{\"content\":\"two\\nlines\"}}]}\r\n\r\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\r\r")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"echo\",\"arguments\":\"{}\"}}]}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	p, err := NewOpenAI(Agent{Alias: "a", Model: "m", BaseURL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var got []Chunk
	res, err := p.Step(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}, func(c Chunk) { got = append(got, c) })
	if err != nil {
		t.Fatal(err)
	}
	if want := []Chunk{{Text: "two\nlines"}, {Thought: true, Text: "hm"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("chunks %+v, want %+v", got, want)
	}
	if want := []ToolCall{{ID: "c1", Name: "echo", Arguments: "{}"}}; !reflect.DeepEqual(res.ToolCalls, want) || res.StopReason != StopToolUse {
		t.Fatalf("result %+v", res)
	}
}

// A server's error event, a stream ending mid-event and an oversized
// event end the step with a clear error.
func TestOpenAIStreamFailures(t *testing.T) {
	cases := map[string]struct{ body, want string }{
		"error event":     {"event: error\ndata: overloaded, retry later\n\n", "openai provider: overloaded, retry later"},
		"error object":    {"data: {\"error\":{\"message\":\"bad key\"}}\n\n", "openai provider: bad key"},
		"cut mid-event":   {"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choi", "openai provider: the stream ended before the response was complete"},
		"oversized event": {"data: " + strings.Repeat("x", DefaultMaxEventBytes+1) + "\n\n", "openai provider: reading the stream failed: server-sent event too large"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			p, err := NewOpenAI(Agent{Alias: "a", Model: "m", BaseURL: srv.URL, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Step(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}, func(Chunk) {})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// What a stream's events emit, byte for byte, now that each is decoded
// from the reader's bytes into one reused chunk: a run of bad UTF-8 in
// the data is one U+FFFD (the reader's replacement, before the JSON
// decoder's own, which would make one a byte), an event without content
// after one with it emits nothing (the reused choice is zeroed), more
// choices than the last event's, and an error event's text as sent.
func TestOpenAIEventsDecodedAsBefore(t *testing.T) {
	body := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\xff\xfeb\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":null}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r\"}},{\"index\":1,\"delta\":{\"content\":\"c\\u00e9\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"echo\",\"arguments\":\"{\\\"x\\\":\"}}]}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n" +
		"data: {\"choices\":[]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xc3\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n" +
		"data: [DONE]\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	p, err := NewOpenAI(Agent{Alias: "a", Model: "m", BaseURL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var got []Chunk
	res, err := p.Step(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}, func(c Chunk) { got = append(got, c) })
	if err != nil {
		t.Fatal(err)
	}
	want := []Chunk{{Text: "a\ufffdb"}, {Thought: true, Text: "r"}, {Text: "c\u00e9"}, {Text: "\ufffd"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("chunks %+v, want %+v", got, want)
	}
	if wantCalls := []ToolCall{{ID: "c1", Name: "echo", Arguments: `{"x":1}`}}; !reflect.DeepEqual(res.ToolCalls, wantCalls) || res.StopReason != StopToolUse {
		t.Fatalf("result %+v", res)
	}

	// An error event's text, bad bytes replaced as before.
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: error\ndata:  over\xffloaded \n\n")
	}))
	t.Cleanup(srv2.Close)
	p2, err := NewOpenAI(Agent{Alias: "a", Model: "m", BaseURL: srv2.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Step(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}, func(Chunk) {}); err == nil || err.Error() != "openai provider: over\ufffdloaded" {
		t.Fatalf("error event: %v", err)
	}
}

// An OpenAI stream's content event costs the session service a bounded
// number of allocations: 14.2 when the reader copied each event's data
// twice and the provider once more, with a new choices array each, and
// json.Unmarshal's state anew; 1.2 now, the content's string and the
// request's own spread over the events.
func TestOpenAIEventAllocations(t *testing.T) {
	const chunks = 500
	var body strings.Builder
	for i := range chunks {
		fmt.Fprintf(&body, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"m","choices":[{"index":0,"delta":{"content":" w%d"},"logprobs":null,"finish_reason":null}]}`+"\n\n", i)
	}
	body.WriteString("data: [DONE]\n\n")
	stream := body.String()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream)
	}))
	t.Cleanup(srv.Close)
	p, err := NewOpenAI(Agent{Alias: "a", Model: "m", BaseURL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}
	n := testing.AllocsPerRun(5, func() {
		if _, err := p.Step(context.Background(), req, func(Chunk) {}); err != nil {
			t.Fatal(err)
		}
	})
	if perEvent := n / chunks; perEvent > maxAllocsPerEvent {
		t.Errorf("%.1f allocations an event, want at most %v", perEvent, maxAllocsPerEvent)
	}
}

// maxAllocsPerEvent is TestOpenAIEventAllocations's bound.
const maxAllocsPerEvent = 3

// BenchmarkOpenAIStream streams one step of 1,000 content chunks, each
// an event as OpenAI's API sends it, from a local server: allocs/op and
// B/op over 1,000 are about a chunk's in the session service (the
// request, the response's head and the server's own are a few dozen an
// op).
func BenchmarkOpenAIStream(b *testing.B) {
	const chunks = 1000
	var body strings.Builder
	for i := range chunks {
		fmt.Fprintf(&body, `data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_4d82f2a4d2","choices":[{"index":0,"delta":{"content":" word%d"},"logprobs":null,"finish_reason":null}]}`+"\n\n", i)
	}
	body.WriteString(`data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_4d82f2a4d2","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n")
	stream := []byte(body.String())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(stream)
	}))
	b.Cleanup(srv.Close)
	p, err := NewOpenAI(Agent{Alias: "a", Model: "m", BaseURL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	req := Request{Messages: []Message{{Role: RoleUser, Content: "hi"}}}
	n := 0
	emit := func(Chunk) { n++ }
	b.ReportAllocs()
	for b.Loop() {
		n = 0
		if _, err := p.Step(context.Background(), req, emit); err != nil {
			b.Fatal(err)
		}
		if n != chunks {
			b.Fatalf("%d chunks, want %d", n, chunks)
		}
	}
}
