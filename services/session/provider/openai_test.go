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
