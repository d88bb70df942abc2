package provider

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// ScriptedProvider is the deterministic, offline provider. It reads the
// latest user prompt line by line:
//
//	/say TEXT         TEXT exactly, as message chunks split at spaces: one
//	                  chunk per word with the spaces that follow it
//	/think TEXT       TEXT as one thought chunk
//	/tool NAME JSON   a call of tool NAME with arguments JSON ({} when absent);
//	                  the step ends there and the next step resumes after it
//	/sleep MS         a pause of MS milliseconds
//	/fail TEXT        the turn fails with TEXT
//	/stamp N [MS]     N message chunks, MS ms apart, each the wall clock in
//	                  Unix nanoseconds when it was produced and a space (for
//	                  latency benchmarks: a client on the same host
//	                  subtracts it)
//	/context          says what the provider was given in this step: one
//	                  line per message, each a JSON object {role, content,
//	                  tool_calls?, tool_call_id?, name?}, one chunk a line
//	anything else     said back as /say would say it
//
// The lines one prompt says (everything but /think, /tool, /sleep, /fail,
// /stamp and empty lines) are joined by a newline: the first chunk of a
// said line after another starts with "\n", so "/say hello world" then
// "/say again" is "hello world\nagain".
//
// It keeps no state: the number of tool results after the latest user
// message says how many /tool lines already ran.
type ScriptedProvider struct{}

// Step implements Provider.
func (ScriptedProvider) Step(ctx context.Context, req Request, emit func(Chunk)) (StepResult, error) {
	last := -1
	for i, m := range req.Messages {
		if m.Role == RoleUser {
			last = i
		}
	}
	if last < 0 {
		return StepResult{StopReason: StopEndTurn}, nil
	}
	done := 0
	for _, m := range req.Messages[last+1:] {
		if m.Role == RoleTool {
			done++
		}
	}
	seen := 0
	said := false
	// say says text, after a newline when a line was said before.
	say := func(text string) {
		if text == "" {
			return
		}
		sayWords(text, said, emit)
		said = true
	}
	for _, line := range strings.Split(req.Messages[last].Content, "\n") {
		line = strings.TrimRight(line, "\r")
		cmd, arg, _ := strings.Cut(line, " ")
		if seen < done {
			// Already run by an earlier step: only what it said matters.
			if cmd == "/tool" {
				seen++
			} else if says(cmd, arg, line) {
				said = true
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return StepResult{}, err
		}
		switch cmd {
		case "/say":
			say(arg)
		case "/think":
			if arg != "" {
				emit(Chunk{Thought: true, Text: arg})
			}
		case "/tool":
			name, args, _ := strings.Cut(strings.TrimSpace(arg), " ")
			args = strings.TrimSpace(args)
			if args == "" {
				args = "{}"
			}
			return StepResult{
				ToolCalls:  []ToolCall{{ID: "scripted_" + strconv.Itoa(seen), Name: name, Arguments: args}},
				StopReason: StopToolUse,
			}, nil
		case "/sleep":
			ms, ok := sleepArg(arg)
			if !ok {
				say(line)
				continue
			}
			t := time.NewTimer(time.Duration(ms) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return StepResult{}, ctx.Err()
			case <-t.C:
			}
		case "/fail":
			return StepResult{}, &Error{Msg: arg}
		case "/context":
			for _, l := range contextLines(req.Messages) {
				if said {
					l = "\n" + l
				}
				emit(Chunk{Text: l})
				said = true
			}
		case "/stamp":
			if err := stamp(ctx, arg, emit); err != nil {
				if ctx.Err() != nil {
					return StepResult{}, ctx.Err()
				}
				say(line)
			}
		default:
			say(line)
		}
	}
	return StepResult{StopReason: StopEndTurn}, nil
}

// says reports whether a line says something, without running it.
func says(cmd, arg, line string) bool {
	switch cmd {
	case "/context":
		return true
	case "/say":
		return arg != ""
	case "/think", "/tool", "/fail":
		return false
	case "/sleep":
		_, ok := sleepArg(arg)
		return !ok
	case "/stamp":
		_, _, ok := stampArgs(arg)
		return !ok
	}
	return line != ""
}

// contextMessage is how /context shows a message.
type contextMessage struct {
	Role       string            `json:"role"`
	Content    string            `json:"content"`
	ToolCalls  []contextToolCall `json:"tool_calls,omitempty"`
	ToolCallID string            `json:"tool_call_id,omitempty"`
	Name       string            `json:"name,omitempty"`
}

type contextToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// contextLines renders messages for /context, one JSON line each.
func contextLines(msgs []Message) []string {
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		cm := contextMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, contextToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
		// Strings and slices of them always encode (bad UTF-8 is replaced).
		line, _ := json.Marshal(cm)
		out = append(out, string(line))
	}
	return out
}

func sleepArg(arg string) (int, bool) {
	ms, err := strconv.Atoi(strings.TrimSpace(arg))
	return ms, err == nil && ms >= 0
}

// sayWords emits text split at spaces: each chunk is a word and the spaces
// that follow it (spaces that open text go with the first word), so the
// chunks put together are text exactly. After another said line the first
// chunk starts with "\n".
func sayWords(text string, newline bool, emit func(Chunk)) {
	start := 0
	for start < len(text) {
		end := start
		for end < len(text) && text[end] == ' ' {
			end++
		}
		for end < len(text) && text[end] != ' ' {
			end++
		}
		for end < len(text) && text[end] == ' ' {
			end++
		}
		piece := text[start:end]
		if newline {
			piece = "\n" + piece
			newline = false
		}
		emit(Chunk{Text: piece})
		start = end
	}
}

// stampArgs parses "N [MS]".
func stampArgs(arg string) (n int, gap time.Duration, ok bool) {
	f := strings.Fields(arg)
	if len(f) == 0 || len(f) > 2 {
		return 0, 0, false
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 0 || n > MaxStampChunks {
		return 0, 0, false
	}
	if len(f) == 2 {
		ms, err := strconv.Atoi(f[1])
		if err != nil || ms < 0 {
			return 0, 0, false
		}
		gap = time.Duration(ms) * time.Millisecond
	}
	return n, gap, true
}

// MaxStampChunks bounds /stamp's N: each chunk is 20 bytes, so past some
// 200,000 of them the turn's reply is cut anyway (MaxReplyBytes).
const MaxStampChunks = 1 << 20

// stampText is a /stamp chunk's text, ns in decimal and a space, built
// in one allocation: FormatInt and a concatenation made two a chunk, the
// turn-stream benchmark's every chunk in the session service.
func stampText(ns int64) string {
	var buf [24]byte // 19 digits and a sign at most, and the space
	return string(append(strconv.AppendInt(buf[:0], ns, 10), ' '))
}

// stamp emits "/stamp N [MS]": N chunks holding the time they were made.
// It ends when ctx does, between any two chunks: with no gap, "/stamp
// 9000000000000000000" ran on through every cancel, a core for ever and
// a turn left running after session/cancel said cancelled.
func stamp(ctx context.Context, arg string, emit func(Chunk)) error {
	n, gap, ok := stampArgs(arg)
	if !ok {
		return strconv.ErrSyntax
	}
	var t *time.Timer // one for the whole stream, reset per chunk
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if i > 0 && gap > 0 {
			if t == nil {
				t = time.NewTimer(gap)
			} else {
				t.Reset(gap)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
		emit(Chunk{Text: stampText(time.Now().UnixNano())})
	}
	return nil
}
