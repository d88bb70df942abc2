package session

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
)

// A session keeps two records (see store_durable.go): the visible
// transcript, which only grows, and the retained provider context, which
// is what the model is given next: the latest snapshot plus the provider
// events checkpointed after its boundary, tool calls and results
// included. Runtime additions (the agent's system prompt) are put in
// front when a turn starts and never stored; hidden reasoning (thoughts)
// is never given back. A session without a snapshot, made before
// snapshots existed, replays its transcript as it always did.

// historyLimit bounds the transcript rows a session without a snapshot
// replays to the provider.
const historyLimit = 200

// MaxToolOutputBytes caps a tool call's output as the transcript, the
// tool call's row and the retained context keep it (and as the provider
// is given it, and a durable pane shows it); the live tool_result update
// carries up to MaxLiveToolOutputBytes of it, and its output_bytes.
const MaxToolOutputBytes = tooloutput.MaxKeptBytes

// MaxLiveToolOutputBytes caps a tool call's output in its tool_result
// update, measured as JSON: a plugin may return 16 MiB, and an update past
// the bus's 8 MiB message was refused, so the client saw a gap where the
// result was.
const MaxLiveToolOutputBytes = 1 << 20

// trimReason is history_trimmed's reason when the budget was passed.
const trimReason = "context_budget"

// capToolOutput cuts out to MaxToolOutputBytes, at a character boundary,
// and says so where it was cut, with the whole output's size.
func capToolOutput(out toolOutput) string { return tooloutput.KeptOf(out.text, out.size()) }

// capLiveOutput cuts out where its JSON reaches MaxLiveToolOutputBytes, at
// a character boundary, and says so where it was cut, with the whole
// output's size.
func capLiveOutput(out toolOutput) string {
	return cutJSONOf(out.text, out.size(), MaxLiveToolOutputBytes, "\n[tool output truncated: %d of %d bytes shown]")
}

// cutJSON is s when its JSON (as jsonstr writes it) fits in limit bytes,
// else s cut where its JSON reaches limit less room for the note, at a
// character boundary, and the note: a format of the bytes kept and the
// bytes there were, plain text of at most 128 bytes.
func cutJSON(s string, limit int, note string) string { return cutJSONOf(s, len(s), limit, note) }

// cutJSONOf is cutJSON of a text of total bytes of which s is the start,
// at least limit bytes of it when it is not the whole (recallAnswer's).
func cutJSONOf(s string, total, limit int, note string) string {
	total = max(total, len(s))
	fits, _ := jsonstr.Fit(s, limit)
	if fits == total {
		return s
	}
	fits, _ = jsonstr.Fit(s, limit-128)
	return s[:fits] + fmt.Sprintf(note, fits, total)
}

// estimateTokens estimates the tokens of a context: a token is about four
// bytes of text (the usual rule of thumb for English with OpenAI's
// tokenizers), rounded up, for each message's content and its tool calls'
// names and arguments, plus 4 per message for its role and framing.
func estimateTokens(msgs []ChatMessage) int64 {
	var n int64
	for _, m := range msgs {
		n += messageTokens(m)
	}
	return n
}

func messageTokens(m ChatMessage) int64 {
	b := len(m.Content) + len(m.Name) + len(m.ToolCallID)
	for _, c := range m.ToolCalls {
		b += len(c.ID) + len(c.Name) + len(c.Arguments)
	}
	return 4 + int64(b+3)/4
}

// trimToBudget drops the oldest turns (a turn is a user message and what
// follows it) until the context fits budget, keeping at least the latest
// turn. It returns what is kept, how many messages were dropped and how
// many turns are kept.
func trimToBudget(msgs []ChatMessage, budget int64) (kept []ChatMessage, dropped, keptTurns int) {
	// starts are the indexes where a turn begins; anything before the
	// first user message counts as one more turn.
	var starts []int
	for i, m := range msgs {
		if m.Role == roleUser || i == 0 {
			starts = append(starts, i)
		}
	}
	total := estimateTokens(msgs)
	first := 0
	for first+1 < len(starts) && total > budget {
		end := starts[first+1]
		total -= estimateTokens(msgs[starts[first]:end])
		first++
	}
	from := 0
	if len(starts) > 0 {
		from = starts[first]
	}
	kept = msgs[from:]
	for _, m := range kept {
		if m.Role == roleUser {
			keptTurns++
		}
	}
	return kept, from, keptTurns
}

// eventsToMessages turns checkpoint events into provider messages: the
// prompt, one assistant message per step (its text and tool calls), a
// tool message per result. A call without a result (its turn ended
// before the call did) is left out, as providers refuse an unanswered
// call, and so is a result without its call.
func eventsToMessages(evs []cpEvent) []ChatMessage {
	calls, results := map[string]bool{}, map[string]bool{}
	for _, e := range evs {
		switch e.Kind {
		case eventToolCall:
			calls[e.ToolCallID] = true
		case eventToolResult:
			results[e.ToolCallID] = true
		}
	}
	var out []ChatMessage
	var cur *ChatMessage
	// text gathers cur's text: a step's reply may be a thousand events
	// (one a checkpoint), and joining them with += copied every one
	// before, at each prompt (BenchmarkEventsToMessages).
	var text strings.Builder
	var curTurn string
	curStep := -1
	end := func() {
		if cur != nil {
			cur.Content = text.String()
			if cur.Content != "" || len(cur.ToolCalls) > 0 {
				out = append(out, *cur)
			}
		}
		cur = nil
		text = strings.Builder{}
	}
	assistant := func(e cpEvent) *ChatMessage {
		if cur == nil || curTurn != e.TurnID || curStep != e.Step {
			end()
			cur, curTurn, curStep = &ChatMessage{Role: roleAssistant}, e.TurnID, e.Step
		}
		return cur
	}
	for _, e := range evs {
		switch e.Kind {
		case eventUser:
			end()
			out = append(out, ChatMessage{Role: roleUser, Content: e.Content})
		case eventText:
			assistant(e)
			text.WriteString(e.Content)
		case eventToolCall:
			if results[e.ToolCallID] {
				m := assistant(e)
				m.ToolCalls = append(m.ToolCalls, ToolCall{ID: e.CallID, Name: e.Name, Arguments: e.Content})
			}
		case eventToolResult:
			if calls[e.ToolCallID] {
				end()
				out = append(out, ChatMessage{Role: roleTool, Content: e.Content, ToolCallID: e.CallID, Name: e.Name})
			}
		}
	}
	end()
	return out
}

// retainedContext is the context a turn's provider is given, without the
// runtime system prompt: the retained context, trimmed to the agent's
// budget first when it passed it. A trim commits the new snapshot and
// the boundary it covers together, and only then is history_trimmed
// published; when that write fails nothing is published and the context
// stays as it is retained.
func (s *Server) retainedContext(ctx context.Context, t *turn, agent AgentConfig) ([]ChatMessage, error) {
	snap, evs, err := s.store.retained(ctx, t.ls.id)
	if err != nil {
		return nil, err
	}
	var msgs []ChatMessage
	boundary := t.userSeq
	if snap.Found {
		msgs = append(slices.Clone(snap.Messages), eventsToMessages(evs)...)
		if n := len(evs); n > 0 {
			boundary = max(boundary, evs[n-1].Seq)
		}
	} else if msgs, err = s.store.legacyHistory(ctx, t.ls.id, historyLimit); err != nil {
		return nil, err
	}
	budget := agent.ContextBudgetTokens
	if budget <= 0 || estimateTokens(msgs) <= budget {
		return msgs, nil
	}
	kept, dropped, keptTurns := trimToBudget(msgs, budget)
	if dropped == 0 {
		return msgs, nil
	}
	if err := s.store.writeSnapshot(ctx, t.ls.id, t.surface, boundary, kept, t.id, dropped); err != nil {
		s.log.Warn("retained context not trimmed", zap.String("session_id", t.ls.id), zap.Error(err))
		return msgs, nil
	}
	s.log.Info("retained context trimmed", zap.String("session_id", t.ls.id), zap.Int("dropped_messages", dropped),
		zap.Int("kept_turns", keptTurns), zap.Int64("boundary", boundary))
	t.publishMapped(s, UpdateHistoryTrimmed, trimNotice(t.id, int64(dropped), int64(keptTurns)), trimCounts(dropped, keptTurns), markTrim)
	return kept, nil
}
