package durablebridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// maxTurnsAsked is what one TurnEvents call may ask about (the session
// service's MaxTurnEventsTurns).
const maxTurnsAsked = 64

// A pane built from the session service (at the bridge's start, or read
// again) shows each turn as a follower of its updates saw it: the prompt
// row, then the turn's thinking, reply and tool items in the order they
// came, under the ids the updates give them, then the turn's other rows
// (a failure's notice). The transcript alone lacks the thoughts, and
// splits the reply at each tool call: a pane built from it lost its
// thinking, and a turn running across the build showed the text said
// before its tool call twice, as a row and in the reply its updates went
// on growing. Turns whose events the session no longer keeps (a context
// trim dropped them) show their rows.

// history is what a pane built from the session shows of its turns,
// besides their rows: each turn's events, by turn id (turns without any
// are absent: their rows show them), and the context trims of turns
// without events, whose notices their rows do not carry.
type history struct {
	shown map[string]*sessionv1.TurnShown
	trims map[string]*sessionv1.TurnTrim
}

// turnEvents reads the shown events of a session's turns, by turn id;
// turns without any are absent. A failed read leaves the rest absent:
// their rows show them. covered is the session's covered_seq: the update
// seq of the last streamed chunk of a running turn the events hold (0
// when none was read). The turns asked are those of the rows read, at
// most a page of them, and so are the trims read.
func (f *follower) turnEvents(ctx context.Context, sessionID string, turnIDs []string) (h history, covered int64) {
	out := map[string]*sessionv1.TurnShown{}
	h = history{shown: out, trims: map[string]*sessionv1.TurnTrim{}}
	for pending := turnIDs; len(pending) > 0; {
		asked := pending[:min(len(pending), maxTurnsAsked)]
		c, cancel := f.call(ctx)
		resp, err := f.b.sessions.TurnEvents(c, &sessionv1.TurnEventsRequest{Principal: operator(), SessionId: sessionID, TurnIds: asked})
		cancel()
		if err != nil {
			f.b.log.Warn("read turn events", zap.String("session_id", sessionID), zap.Error(err))
			return h, covered
		}
		covered = max(covered, resp.GetCoveredSeq())
		for _, tr := range resp.GetTrims() {
			h.trims[tr.GetTurnId()] = tr
		}
		turns := resp.GetTurns()
		if len(turns) == 0 {
			pending = pending[len(asked):]
			continue
		}
		// The turns come in the order asked: those after the last one
		// given may not have fitted, and are asked again.
		for _, t := range turns {
			out[t.GetTurnId()] = t
		}
		last := turns[len(turns)-1].GetTurnId()
		for i, id := range asked {
			if id == last {
				pending = pending[i+1:]
				break
			}
		}
	}
	return h, covered
}

// turnsOf lists the turns that wrote rows, in order.
func turnsOf(rows []*sessionv1.TranscriptMessage) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range rows {
		if id := m.GetTurnId(); id != "" && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// showHistory shows transcript rows as items, each turn with events in
// shown as its followers saw it. Rows before the pane's transcriptNext
// are skipped.
//
// A turn without events whose start trimmed the context shows the trim's
// notice after its prompt, as its follower did (before its first row
// when the page starts after the prompt).
func (f *follower) showHistory(p *pane, rows []*sessionv1.TranscriptMessage, h history) {
	applied := map[string]bool{}
	trimShown := func(m *sessionv1.TranscriptMessage) {
		tr := h.trims[m.GetTurnId()]
		if tr == nil || applied[tr.GetTurnId()] {
			return
		}
		applied[tr.GetTurnId()] = true
		at := m.GetCreatedAt().AsTime()
		if tr.GetTrimmedAt() != nil {
			at = tr.GetTrimmedAt().AsTime()
		}
		p.putTrimNotice(trimItemID(tr.GetTurnId(), 0), tr.GetTrimmedMessages(), at)
	}
	for _, m := range rows {
		if m.GetIndex() < p.transcriptNext {
			continue
		}
		p.transcriptNext = m.GetIndex() + 1
		role := m.GetRole()
		if role == "user" && p.firstPrompt == "" {
			p.firstPrompt = m.GetContent()
		}
		t := h.shown[m.GetTurnId()]
		if t == nil && role != "user" {
			trimShown(m) // the page starts after the turn's prompt
		}
		if t != nil && !applied[t.GetTurnId()] && role != "user" {
			// The page starts after the turn's prompt.
			applied[t.GetTurnId()] = true
			p.showTurn(t, m.GetCreatedAt().AsTime())
		}
		if t == nil || role != "assistant" && role != "tool" {
			p.putItem(rowItemID(m.GetIndex()), roleKind(role), m.GetContent(), m.GetCreatedAt().AsTime(), false)
		}
		if t == nil && role == "user" {
			trimShown(m)
		}
		if t != nil && !applied[t.GetTurnId()] {
			applied[t.GetTurnId()] = true
			p.showTurn(t, m.GetCreatedAt().AsTime())
		}
	}
}

// showTurn shows a turn's events as its updates did (follower.apply), and
// its end as turnEnded does. An item is shown at its first event's time,
// as a follower showed it when that event's update came; at (the row's)
// is for events that carry none, and for the end.
func (p *pane) showTurn(t *sessionv1.TurnShown, rowAt time.Time) {
	id := t.GetTurnId()
	if n := t.GetTrimmedMessages(); n > 0 {
		// The trim came at the turn's start, before anything it showed.
		at := rowAt
		if t.GetTrimmedAt() != nil {
			at = t.GetTrimmedAt().AsTime()
		}
		p.putTrimNotice(trimItemID(id, 0), n, at)
	}
	at := rowAt
	for _, e := range t.GetEvents() {
		at = rowAt
		if e.GetAt() != nil {
			at = e.GetAt().AsTime()
		}
		switch e.GetKind() {
		case "thought":
			p.putItem(id+":thinking", kindThinking, e.GetText(), at, true)
		case "text":
			p.putItem(id+":reply", kindReply, e.GetText(), at, true)
		case "tool_call":
			p.putItem(e.GetToolCallId(), kindTool, e.GetName()+" "+liveInput(e.GetText()), at, false)
		case "tool_result":
			p.putToolResult(e.GetToolCallId(), e.GetName(), e.GetStatus(), e.GetText(), at)
		}
	}
	if t.GetEnded() && t.GetContent() != "" {
		// The reply item is there already when text was streamed: its
		// time stays.
		p.putItem(id+":reply", kindReply, t.GetContent(), rowAt, false)
	}
}

// putToolResult adds a tool call's result to its item, once: a result
// read from the session's events may come again as an update.
// output is as the session kept it (read back, or cut by liveOutput).
func (p *pane) putToolResult(toolCallID, name, status, output string, at time.Time) {
	line := status + ": " + output
	it := p.itemByID[toolCallID]
	switch {
	case it == nil:
		p.putItem(toolCallID, kindTool, name+" "+line, at, false)
	case it.resulted:
		return
	default:
		p.putItem(toolCallID, kindTool, "\n"+line, at, true)
	}
	if it := p.itemByID[toolCallID]; it != nil {
		it.resulted = true
	}
}

// liveInput is a tool call's arguments as its tool_call update carries
// them (session.liveToolInput): JSON compacted, anything else as a JSON
// string.
func liveInput(args string) string {
	args = strings.TrimSpace(args)
	if args == "" {
		return "{}"
	}
	var b bytes.Buffer
	if json.Valid([]byte(args)) && json.Compact(&b, []byte(args)) == nil {
		return b.String()
	}
	raw, _ := json.Marshal(args)
	return string(raw)
}

// trimItemID is the id of the notice of a trim made at turn's start: the
// same whether a follower showed it from the update or a rebuilt pane
// from the turn's row (one trim a turn). An update naming no turn keeps
// its seq's.
func trimItemID(turn string, seq int64) string {
	if turn == "" {
		return fmt.Sprintf("trim-%d", seq)
	}
	return "trim-" + turn
}

// putTrimNotice shows that a trim dropped n messages of the context.
func (p *pane) putTrimNotice(id string, n int64, at time.Time) {
	p.putItem(id, kindNotice, fmt.Sprintf("Older history was trimmed (%d messages)", n), at, false)
}
