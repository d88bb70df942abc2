package provider

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scripted provider's rules, step by step.
func TestScriptedProvider(t *testing.T) {
	user := func(text string, toolResults int) []Message {
		msgs := []Message{{Role: RoleUser, Content: "an older prompt\n/tool echo {}"}, {Role: RoleAssistant, Content: "x"}, {Role: RoleUser, Content: text}}
		for i := 0; i < toolResults; i++ {
			msgs = append(msgs, Message{Role: RoleAssistant}, Message{Role: RoleTool, Content: "out"})
		}
		return msgs
	}
	cases := []struct {
		name    string
		msgs    []Message
		chunks  []Chunk
		calls   []ToolCall
		failure string
	}{
		// A /say line is its TEXT exactly: each word keeps the spaces after it.
		{name: "say splits at spaces", msgs: user("/say Hello  big world ", 0),
			chunks: []Chunk{{Text: "Hello  "}, {Text: "big "}, {Text: "world "}}},
		{name: "say keeps its text", msgs: user("/say alpha beta", 0),
			chunks: []Chunk{{Text: "alpha "}, {Text: "beta"}}},
		{name: "leading spaces go with the first word", msgs: user("/say   x y", 0),
			chunks: []Chunk{{Text: "  x "}, {Text: "y"}}},
		// Said lines are joined by a newline.
		{name: "other lines are said", msgs: user("just text\r\n\n/unknown cmd", 0),
			chunks: []Chunk{{Text: "just "}, {Text: "text"}, {Text: "\n/unknown "}, {Text: "cmd"}}},
		{name: "think is one chunk", msgs: user("/think a b c\n/say x", 0),
			chunks: []Chunk{{Thought: true, Text: "a b c"}, {Text: "x"}}},
		{name: "tool ends the step", msgs: user("/say a\n/tool echo {\"k\": 1}\n/say b", 0),
			chunks: []Chunk{{Text: "a"}}, calls: []ToolCall{{ID: "scripted_0", Name: "echo", Arguments: `{"k": 1}`}}},
		{name: "resumes after the tool", msgs: user("/say a\n/tool echo {\"k\": 1}\n/say b\n/tool other\n/say c", 1),
			chunks: []Chunk{{Text: "\nb"}}, calls: []ToolCall{{ID: "scripted_1", Name: "other", Arguments: "{}"}}},
		{name: "last step", msgs: user("/say a\n/tool echo {}\n/say b\n/tool other\n/say c", 2),
			chunks: []Chunk{{Text: "\nc"}}},
		{name: "nothing said before the tool", msgs: user("/think t\n/tool echo {}\n/say b", 1),
			chunks: []Chunk{{Text: "b"}}},
		{name: "fail", msgs: user("/say a\n/fail it broke\n/say b", 0),
			chunks: []Chunk{{Text: "a"}}, failure: "it broke"},
		{name: "bad sleep is said", msgs: user("/sleep soon", 0),
			chunks: []Chunk{{Text: "/sleep "}, {Text: "soon"}}},
		{name: "context says what the provider was given", msgs: []Message{
			{Role: RoleSystem, Content: "be brief"}, {Role: RoleUser, Content: "/say a"}, {Role: RoleAssistant, Content: "a", ToolCalls: []ToolCall{{ID: "c", Name: "echo", Arguments: "{}"}}},
			{Role: RoleTool, Content: "{}", ToolCallID: "c", Name: "echo"}, {Role: RoleUser, Content: "/say b\n/context"}},
			chunks: []Chunk{{Text: "b"},
				{Text: "\n" + `{"role":"system","content":"be brief"}`}, {Text: "\n" + `{"role":"user","content":"/say a"}`},
				{Text: "\n" + `{"role":"assistant","content":"a","tool_calls":[{"id":"c","name":"echo","arguments":"{}"}]}`},
				{Text: "\n" + `{"role":"tool","content":"{}","tool_call_id":"c","name":"echo"}`},
				{Text: "\n" + `{"role":"user","content":"/say b\n/context"}`}}},
		{name: "no user message", msgs: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []Chunk
			res, err := ScriptedProvider{}.Step(context.Background(), Request{Messages: tc.msgs}, func(c Chunk) { got = append(got, c) })
			if tc.failure != "" {
				if err == nil || err.Error() != tc.failure || !errors.Is(err, ErrProvider) {
					t.Fatalf("err %v, want %q", err, tc.failure)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.chunks) {
				t.Fatalf("chunks %+v, want %+v", got, tc.chunks)
			}
			if !reflect.DeepEqual(res.ToolCalls, tc.calls) {
				t.Fatalf("calls %v, want %v", res.ToolCalls, tc.calls)
			}
		})
	}

	// /stamp: N chunks, each a Unix-nanosecond time within the call.
	before := time.Now().UnixNano()
	var stamps []Chunk
	if _, err := (ScriptedProvider{}).Step(context.Background(), Request{Messages: user("/stamp 3 1", 0)}, func(c Chunk) { stamps = append(stamps, c) }); err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixNano()
	if len(stamps) != 3 {
		t.Fatalf("stamps %+v", stamps)
	}
	for _, c := range stamps {
		ns, err := strconv.ParseInt(strings.TrimSuffix(c.Text, " "), 10, 64)
		if err != nil || ns < before || ns > after {
			t.Fatalf("stamp %q not a time within the call", c.Text)
		}
		// The bytes clients read: the decimal time and one space.
		if want := strconv.FormatInt(ns, 10) + " "; c.Text != want {
			t.Fatalf("stamp %q, want %q", c.Text, want)
		}
	}
	var bad []Chunk
	if _, err := (ScriptedProvider{}).Step(context.Background(), Request{Messages: user("/stamp many", 0)}, func(c Chunk) { bad = append(bad, c) }); err != nil || len(bad) != 2 || bad[0].Text != "/stamp " {
		t.Fatalf("a bad /stamp is said: %+v %v", bad, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (ScriptedProvider{}).Step(ctx, Request{Messages: user("/sleep 60000", 0)}, func(Chunk) {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sleep: %v", err)
	}
}

// /stamp with no gap ends as soon as its context does, and refuses an N
// past MaxStampChunks (said, like any bad /stamp).
func TestScriptedStampEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	start := time.Now()
	_, err := (ScriptedProvider{}).Step(ctx, Request{Messages: []Message{{Role: RoleUser, Content: fmt.Sprintf("/stamp %d", MaxStampChunks)}}}, func(Chunk) {
		if n++; n == 10 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || n != 10 {
		t.Fatalf("after %d chunks and %v: %v; want context.Canceled after 10", n, time.Since(start), err)
	}
	var said []Chunk
	if _, err := (ScriptedProvider{}).Step(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: fmt.Sprintf("/stamp %d", MaxStampChunks+1)}}},
		func(c Chunk) { said = append(said, c) }); err != nil || len(said) != 2 || said[0].Text != "/stamp " {
		t.Fatalf("an N past the bound: %+v %v", said, err)
	}
}

// stampText writes what FormatInt and a space wrote, for any int64.
func TestStampText(t *testing.T) {
	for _, ns := range []int64{0, 1, -1, 9, 10, 1796357943194065258, math.MaxInt64, math.MinInt64, time.Now().UnixNano()} {
		if got, want := stampText(ns), strconv.FormatInt(ns, 10)+" "; got != want {
			t.Errorf("stampText(%d) = %q, want %q", ns, got, want)
		}
	}
}

// A /stamp chunk costs one allocation, its text: the turn-stream
// benchmark's session service makes one a chunk. FormatInt and a
// concatenation made two.
func TestStampAllocatesOnceAChunk(t *testing.T) {
	const chunks = 100
	emit := func(Chunk) {}
	// Per run: the chunks, beside two for the call (strings.Fields's
	// slice of the arguments, the timer variable its deferred stop holds).
	if n := testing.AllocsPerRun(20, func() {
		if err := stamp(context.Background(), strconv.Itoa(chunks), emit); err != nil {
			t.Fatal(err)
		}
	}); n > chunks+2 {
		t.Errorf("%.0f allocations for %d chunks, want at most %d", n, chunks, chunks+2)
	}
}

// BenchmarkStamp streams 1,000 /stamp chunks an op, without a gap:
// allocs/op and B/op over 1,000 are a chunk's.
func BenchmarkStamp(b *testing.B) {
	emit := func(Chunk) {}
	b.ReportAllocs()
	for b.Loop() {
		if err := stamp(context.Background(), "1000", emit); err != nil {
			b.Fatal(err)
		}
	}
}
