package session

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// scripted is the deterministic, offline provider. It reads the latest
// user prompt line by line:
//
//	/say TEXT         TEXT as message chunks, one per word, each with a trailing space
//	/think TEXT       TEXT as one thought chunk
//	/tool NAME JSON   a call of tool NAME with arguments JSON ({} when absent);
//	                  the step ends there and the next step resumes after it
//	/sleep MS         a pause of MS milliseconds
//	/fail TEXT        the turn fails with TEXT
//	/stamp N [MS]     N message chunks, MS ms apart, each the wall clock in
//	                  Unix nanoseconds when it was produced (for latency
//	                  benchmarks: a client on the same host subtracts it)
//	anything else     streamed back as /say would
//
// It keeps no state: the number of tool results after the latest user
// message says how many /tool lines already ran.
type scripted struct{}

func (scripted) Step(ctx context.Context, req ProviderRequest, emit func(Chunk)) (StepResult, error) {
	last := -1
	for i, m := range req.Messages {
		if m.Role == roleUser {
			last = i
		}
	}
	if last < 0 {
		return StepResult{StopReason: stopEndTurn}, nil
	}
	done := 0
	for _, m := range req.Messages[last+1:] {
		if m.Role == roleTool {
			done++
		}
	}
	seen := 0
	for _, line := range strings.Split(req.Messages[last].Content, "\n") {
		line = strings.TrimRight(line, "\r")
		cmd, arg, _ := strings.Cut(line, " ")
		if seen < done {
			if cmd == "/tool" {
				seen++
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return StepResult{}, err
		}
		switch cmd {
		case "/say":
			say(arg, emit)
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
				StopReason: stopToolUse,
			}, nil
		case "/sleep":
			ms, err := strconv.Atoi(strings.TrimSpace(arg))
			if err != nil || ms < 0 {
				say(line, emit)
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
			return StepResult{}, &providerError{msg: arg}
		case "/stamp":
			if err := stamp(ctx, arg, emit); err != nil {
				if ctx.Err() != nil {
					return StepResult{}, ctx.Err()
				}
				say(line, emit)
			}
		default:
			say(line, emit)
		}
	}
	return StepResult{StopReason: stopEndTurn}, nil
}

// say streams text split at spaces, one chunk per word, each word with
// its trailing space (the last one too), so consecutive lines read as
// words: "/say hello world" then "/say again" is "hello world again ".
func say(text string, emit func(Chunk)) {
	for _, w := range strings.Split(text, " ") {
		if w != "" {
			emit(Chunk{Text: w + " "})
		}
	}
}

// stamp emits "/stamp N [MS]": N chunks holding the time they were made.
func stamp(ctx context.Context, arg string, emit func(Chunk)) error {
	f := strings.Fields(arg)
	if len(f) == 0 || len(f) > 2 {
		return strconv.ErrSyntax
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 0 {
		return strconv.ErrSyntax
	}
	var gap time.Duration
	if len(f) == 2 {
		ms, err := strconv.Atoi(f[1])
		if err != nil || ms < 0 {
			return strconv.ErrSyntax
		}
		gap = time.Duration(ms) * time.Millisecond
	}
	for i := range n {
		if i > 0 && gap > 0 {
			t := time.NewTimer(gap)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		emit(Chunk{Text: strconv.FormatInt(time.Now().UnixNano(), 10) + " "})
	}
	return nil
}
