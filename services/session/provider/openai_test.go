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
