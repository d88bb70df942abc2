package session

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/pgtext"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	"github.com/clawmesh/clawmesh/services/session/provider"
)

// Outcomes of turn_complete, and stop reasons of PromptResponse.
const (
	OutcomeCompleted = "completed"
	OutcomeCancelled = "cancelled"
	OutcomeFailed    = "failed"

	stopEndTurn   = provider.StopEndTurn
	stopToolUse   = provider.StopToolUse
	stopCancelled = "cancelled"
	stopError     = "error"
	stopMaxTokens = "max_tokens"
)

// MaxReplyBytes bounds what a provider streams in one turn, its reply and
// its thoughts together, measured as JSON (a control character is six
// bytes): about a million tokens of text, more than any model's output,
// and a reply whose turn_complete fits one bus message (8 MiB). Without
// it a provider that streams without end (a model in a loop, a broken or
// hostile endpoint) kept its turn running for good, the reply growing in
// memory, and a long reply's turn_complete was refused by the bus, so the
// client never saw its turn end. Past it the step is cut and the turn
// completes with what fits, stop_reason max_tokens, as when a model runs
// out of tokens.
const MaxReplyBytes = 4 << 20

// checkToolCalls refuses a step's tool calls past provider.MaxToolCalls
// or provider.MaxToolCallBytes, whichever provider made them (the openai
// provider stops reading at the bound; the scripted one takes a prompt's
// line of up to the 8 MiB frame).
func checkToolCalls(calls []ToolCall) error {
	if len(calls) > provider.MaxToolCalls {
		return fmt.Errorf("the provider asked for %d tool calls in one step; the limit is %d", len(calls), provider.MaxToolCalls)
	}
	size := 0
	for _, c := range calls {
		if len(c.Name) > MaxToolNameBytes {
			return fmt.Errorf("the provider asked for a tool named in %d bytes; the limit is %d", len(c.Name), MaxToolNameBytes)
		}
		size += len(c.ID) + len(c.Name) + len(c.Arguments)
	}
	if size > provider.MaxToolCallBytes {
		return fmt.Errorf("the provider asked for tool calls of %d bytes in one step; the limit is %d", size, provider.MaxToolCallBytes)
	}
	return nil
}

// Bounds on what a provider says beside its reply, each within what one
// update may carry on the bus (8 MiB) with room to spare, measured as
// JSON where the text is JSON-escaped (a '<' is six bytes there):
//
//   - MaxToolNameBytes: a tool's name in a call; no tool has a longer one
//     (a plugin's are at most 64 bytes), and a call's name goes into its
//     tool_call and tool_result updates.
//   - MaxFailureBytes: a failed turn's message, which its turn_complete
//     carries twice (content and error). A provider's error event of 2 MiB
//     of '<' made a 24 MiB turn_complete the bus refused: followers never
//     saw the turn end.
//   - MaxStopReasonBytes: a stop reason passed on from a provider; one
//     longer, or not a plain word, is stopOther.
//   - MaxLiveToolInputBytes: a call's arguments in its tool_call update,
//     which carries them twice (raw_input and rawInput). Arguments within
//     provider.MaxToolCallBytes made a 12 MiB update when escaped.
const (
	MaxToolNameBytes      = 256
	MaxFailureBytes       = 8 << 10
	MaxStopReasonBytes    = 64
	MaxLiveToolInputBytes = 1 << 20
)

// stopOther is the stop reason of a provider's that is too long or not a
// plain word.
const stopOther = "other"

// capFailure cuts a failure message where its JSON reaches
// MaxFailureBytes, at a character boundary, and says so.
func capFailure(msg string) string {
	return cutJSON(msg, MaxFailureBytes, " [message truncated: %d of %d bytes]")
}

// boundStopReason passes a provider's stop reason on when it is a plain
// word ([A-Za-z0-9_.-]) of at most MaxStopReasonBytes, else stopOther.
func boundStopReason(s string) string {
	if len(s) > MaxStopReasonBytes {
		return stopOther
	}
	for i := range len(s) {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return stopOther
		}
	}
	return s
}

// liveToolInput is a call's arguments as its tool_call update shows them:
// raw (JSON, or the text as a string when it is not JSON) while their JSON
// fits MaxLiveToolInputBytes, else the text cut there with a note. Measured
// as a JSON string, which is never shorter than the same text embedded as
// JSON.
func liveToolInput(args []byte, raw any) any {
	s := string(args)
	if cut := cutJSON(s, MaxLiveToolInputBytes, "\n[tool input truncated: %d of %d bytes shown]"); cut != s {
		return cut
	}
	return raw
}

// jsonbSafe reports whether valid JSON text can be stored as jsonb:
// PostgreSQL refuses the escape \u0000 and a surrogate escape not in a
// pair, which encoding/json accepts. Such arguments were refused by the
// tool_calls row's insert, and the call ran with no row.
func jsonbSafe(b []byte) bool {
	hex := func(i int) (rune, bool) { // the escape \uXXXX at b[i], if it is one
		if i+6 > len(b) || b[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 32)
		return rune(v), err == nil
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		v, ok := hex(i)
		switch {
		case !ok:
			i++ // a two-byte escape: \\ among them
		case v == 0 || v >= 0xDC00 && v <= 0xDFFF:
			return false
		case v >= 0xD800 && v <= 0xDBFF:
			if lo, ok := hex(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 11
		default:
			i += 5
		}
	}
	return true
}

// errReplyTooLong is the cause a step is cut with at MaxReplyBytes.
var errReplyTooLong = errors.New("the provider's reply passed its bound")

// errStepTooLong is the cause a step is cut with at its agent's
// StepTimeout: the idle timeout resets on every byte, so a provider
// sending keep-alives and nothing else held its turn for good.
var errStepTooLong = errors.New("the provider's step passed its time")

// turn is one running prompt. Its context derives from the server's base
// context and is cancelled with a cause (session/cancel, the prompting
// connection closing, the caller leaving, the session ending, shutdown).
type turn struct {
	id        string
	ls        *liveSession
	alias     string
	surface   string
	principal *commonv1.Principal
	connID    string
	gen       *int64

	// log holds the turn's checkpoint events until they are written;
	// userSeq is the number of its first one, the prompt; step is the
	// provider step running.
	log     *turnLog
	userSeq int64
	step    int
	// shown is how much of the text the turn said (its steps' text, in
	// order) is in the transcript, and unshown the text of the steps up
	// to the running one that is not: a step that asks for tools has its
	// text written before its tool calls' rows (showText), the rest is
	// written at the turn's end. Only the turn's goroutine uses them.
	shown   int
	unshown string
	// updates is where each update the turn published lives in its
	// checkpoint events (see migration 0016), at most
	// maxMappedUpdates; mapOver is set past it. Only the turn's
	// goroutine changes them, holding mapMu from an update's publish to
	// its mapping, so that Resend, which reads them under mapMu, finds
	// every update the turn published mapped. seqFrom is the session's
	// last update number when the turn was admitted (-1: not known): the
	// turn's updates are numbered past it.
	mapMu   sync.Mutex
	updates []int64
	mapOver bool
	seqFrom int64

	// acted is the decision each of the turn's asks ended with, the one
	// the turn acted on, by its tool call's id: from the ask's end, when
	// it leaves ls.approvals, to the turn's, under ls.mu, for Resend. A
	// cancelled ask's row stays pending until the turn's end marks it
	// (finishTurnTx), and a Resend meanwhile sent it undecided. Bounded
	// by the turn's calls (MaxSteps × provider.MaxToolCalls).
	acted map[string]decision
	// asked are the same asks by request id, for an Approve sent after
	// the ask left ls.approvals, while the turn runs: it is answered with
	// the decision the turn acted on, which the row may not say yet.
	asked map[string]*approval
	// unrecorded are the request ids of the asks whose decision could not
	// be stored, cancelled instead: the turn's end stores them cancelled
	// whatever a write that failed may have committed. Only the turn's
	// goroutine uses it.
	unrecorded []string

	ctx    context.Context
	cancel context.CancelCauseFunc
	// done is closed after turn_complete was published and the session
	// was freed for the next turn; result is set before.
	done   chan struct{}
	result turnResult
	// ended is set, under ls.mu, once the turn's turn_complete was
	// published: by finish, or by endAbandoned before its session's
	// deletion when the turn did not unwind in time.
	ended bool
}

type turnResult struct {
	Outcome, StopReason, Content string
	// Error is the failure message of a failed turn; Said is the reply
	// it had streamed before it failed.
	Error, Said string
}

// unwound runs a write that must happen even when ctx was cancelled (a
// turn's records while it unwinds): ctx's values, no cancellation, the
// unwind bound as deadline.
func (s *Server) unwound(ctx context.Context, write func(context.Context) error) error {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.UnwindTimeout)
	defer cancel()
	return write(c)
}

// runTurn runs t to its end and publishes its turn_complete. It is the
// only goroutine a turn has; the server's WaitGroup counts it.
func (s *Server) runTurn(t *turn) {
	defer s.wg.Done()
	res := s.loop(t)
	if res.Outcome == OutcomeCancelled {
		s.log.Info("turn cancelled", zap.String("session_id", t.ls.id), zap.String("turn_id", t.id), zap.NamedError("cause", context.Cause(t.ctx)))
	}
	s.finish(t, res)
}

// loop is the agent loop: the retained context goes to the provider, its
// output streams out (and into the turn's checkpoint) as it arrives, each
// tool call it asks for runs (after an approval when one is required) and
// its result goes back, until the provider stops.
func (s *Server) loop(t *turn) turnResult {
	ctx := t.ctx
	// The message said so far is the earlier steps' text, said, and the
	// running step's, step: each chunk is copied into one builder, not
	// into one for the step and one for the whole turn as well.
	var said string
	var step strings.Builder
	content := func() string { return said + step.String() }
	failed := func(err error) turnResult {
		if ctx.Err() != nil {
			return turnResult{Outcome: OutcomeCancelled, StopReason: stopCancelled, Content: content()}
		}
		msg := capFailure(err.Error())
		if msg == "" {
			msg = "turn failed"
		}
		return turnResult{Outcome: OutcomeFailed, StopReason: stopError, Content: msg, Error: msg, Said: content()}
	}

	agent, err := s.cfg.Agents.Agent(ctx, t.alias)
	if err != nil {
		if errors.Is(err, ErrUnknownAgent) {
			return failed(fmt.Errorf("Agent `%s` is not configured", t.alias))
		}
		s.log.Warn("resolve agent", zap.String("agent_alias", t.alias), zap.Error(err))
		if errors.Is(err, configclient.ErrConfigNoAnswer) {
			return failed(fmt.Errorf("could not read the agent's settings: %w", configclient.ErrConfigNoAnswer))
		}
		return failed(errors.New("config service unavailable: could not read the agent's settings"))
	}
	factory, ok := s.providers[agent.Provider]
	if !ok {
		return failed(fmt.Errorf("Agent `%s` names unknown provider `%s`", t.alias, agent.Provider))
	}
	prov, err := factory(agent)
	if err != nil {
		return failed(err)
	}
	history, err := s.retainedContext(ctx, t, agent)
	if err != nil {
		s.log.Warn("read history", zap.String("session_id", t.ls.id), zap.Error(err))
		return failed(errors.New("session storage unavailable"))
	}
	var msgs []ChatMessage
	if agent.SystemPrompt != "" {
		msgs = append(msgs, ChatMessage{Role: roleSystem, Content: agent.SystemPrompt})
	}
	msgs = append(msgs, history...)
	tools, unlisted := s.toolsFor(ctx, agent)
	specs := tools.specs()

	// streamed counts what the provider streamed in this turn, thoughts
	// included, as JSON; past MaxReplyBytes the step is cut (cutStep) and
	// the turn ends with what fits.
	streamed, cut := 0, false
	cutStep := context.CancelCauseFunc(func(error) {}) // a no-op for what is emitted before the first step
	emit := func(c Chunk) {
		if c.Text == "" || cut {
			return
		}
		fits, written := jsonstr.Fit(c.Text, MaxReplyBytes-streamed)
		streamed += written
		if fits < len(c.Text) {
			c.Text, cut = c.Text[:fits], true
			cutStep(errReplyTooLong)
			if c.Text == "" {
				return
			}
		}
		typ := UpdateThoughtChunk
		if !c.Thought {
			typ = UpdateMessageChunk
			step.WriteString(c.Text)
		}
		t.mapMu.Lock()
		seq := s.publishChunk(t.ls, typ, t.id, c.Text)
		if pgtext.Text(c.Text) != c.Text {
			// Stored otherwise than it was sent (NUL, bad UTF-8): the
			// stored text's offsets are not the sent one's.
			t.stopMap()
		}
		// The log marks the chunk with its text (see turnLog.marks).
		event, end := t.log.stream(t.step, c.Thought, c.Text, seq)
		t.mapUpdate(seq, event, end)
		t.mapMu.Unlock()
	}
	if unlisted != "" {
		// The turn runs without the plugin tools: its client is told,
		// first, as a thought (a message chunk would be part of the
		// reply, its transcript and the provider's context), streamed,
		// stored and sent again like any other.
		emit(Chunk{Thought: true, Text: unlisted})
	}
	for n := 0; ; n++ {
		if n >= s.cfg.MaxSteps {
			return failed(fmt.Errorf("%w: the provider asked for tools %d times in one turn", ErrTooManySteps, n))
		}
		t.step = n
		stepCtx, cancel := context.WithCancelCause(ctx)
		cutStep = cancel
		stepCtx, stopClock := context.WithTimeoutCause(stepCtx, agent.StepTimeout, errStepTooLong)
		res, err := prov.Step(stepCtx, ProviderRequest{Agent: agent.providerAgent(), Messages: msgs, Tools: specs}, emit)
		overran := errors.Is(context.Cause(stepCtx), errStepTooLong)
		stopClock()
		cancel(nil)
		if ctx.Err() != nil {
			return turnResult{Outcome: OutcomeCancelled, StopReason: stopCancelled, Content: content()}
		}
		if cut {
			// The step's tool calls, if any came before the cut, are
			// dropped with the rest of its reply.
			return turnResult{Outcome: OutcomeCompleted, StopReason: stopMaxTokens, Content: content()}
		}
		if err != nil && overran {
			return failed(fmt.Errorf("the provider did not finish its step within %s (agents.%s.step_timeout_secs)", agent.StepTimeout, t.alias))
		}
		if err != nil {
			return failed(err)
		}
		if err := checkToolCalls(res.ToolCalls); err != nil {
			return failed(err)
		}
		msgs = append(msgs, ChatMessage{Role: roleAssistant, Content: step.String(), ToolCalls: res.ToolCalls})
		said += step.String()
		step.Reset()
		if len(res.ToolCalls) == 0 {
			stop := boundStopReason(res.StopReason)
			if stop == "" {
				stop = stopEndTurn
			}
			return turnResult{Outcome: OutcomeCompleted, StopReason: stop, Content: content()}
		}
		t.unshown = said[t.shown:]
		for _, call := range res.ToolCalls {
			out := s.runTool(ctx, t, agent, tools, call)
			msgs = append(msgs, ChatMessage{Role: roleTool, Content: out, ToolCallID: call.ID, Name: call.Name})
		}
		if ctx.Err() != nil {
			return turnResult{Outcome: OutcomeCancelled, StopReason: stopCancelled, Content: content()}
		}
	}
}

// Tool result statuses, in tool_result updates and tool_calls rows.
const (
	toolCompleted = "completed"
	toolFailed    = "failed"
	toolDenied    = "denied"
	toolCancelled = "cancelled"
)

// runTool runs one call the provider asked for: tool_call, the approval
// when required, the call itself, tool_result. Whatever happens, the
// call gets its tool_result and the turn goes on (or unwinds, when ctx is
// done); the output is what the provider is told.
func (s *Server) runTool(ctx context.Context, t *turn, agent AgentConfig, tools *toolSet, call ToolCall) string {
	ls := t.ls
	id := ids.New("tc_")
	args := json.RawMessage(strings.TrimSpace(call.Arguments))
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	var rawInput any = args
	validArgs := json.Valid(args)
	if validArgs {
		var buf bytes.Buffer
		if json.Compact(&buf, args) == nil {
			args = buf.Bytes()
			rawInput = json.RawMessage(args)
		}
	} else {
		rawInput = string(args)
	}
	stored := args
	if !validArgs || !jsonbSafe(args) {
		stored, _ = json.Marshal(string(args))
	}
	// The call is checkpointed, with the events before it, before it runs.
	callEvent := t.log.add(cpEvent{Step: t.step, Kind: eventToolCall, Content: call.Arguments, CallID: call.ID, ToolCallID: id, Name: call.Name})
	if err := s.unwound(ctx, func(c context.Context) error {
		return s.cp.write(c, t.log, func(tx pgx.Tx) error {
			if err := s.showTextTx(c, tx, t); err != nil {
				return err
			}
			return insertToolCallTx(c, tx, ls.id, t.id, toolCall{ID: id, Name: call.Name, Arguments: stored}, "running")
		})
	}); err != nil {
		s.log.Warn("record tool call", zap.String("session_id", ls.id), zap.Error(err))
	} else {
		t.textShown()
	}
	t.publishMapped(s, UpdateToolCall, fields{"turn_id": t.id, "tool_call_id": id, "name": call.Name, "raw_input": liveToolInput(args, rawInput)}, callEvent, markTool)

	out, st := s.toolOutcome(ctx, t, agent, tools, call.Name, id, callEvent, args, validArgs)
	kept := capToolOutput(out)

	resultEvent := t.log.add(cpEvent{Step: t.step, Kind: eventToolResult, Content: kept, CallID: call.ID, ToolCallID: id, Name: call.Name})
	if err := s.unwound(ctx, func(c context.Context) error {
		return s.cp.write(c, t.log, func(tx pgx.Tx) error {
			if err := finishToolCallTx(c, tx, ls.id, id, kept, out.size(), st); err != nil {
				return err
			}
			if err := s.showTextTx(c, tx, t); err != nil {
				return err
			}
			_, err := appendMessageTx(c, tx, ls.id, t.id, roleTool, call.Name+": "+kept)
			return err
		})
	}); err != nil && !errors.Is(err, errTurnGone) {
		s.log.Warn("record tool result", zap.String("session_id", ls.id), zap.Error(err))
	} else if err == nil {
		t.textShown()
	}
	t.publishMapped(s, UpdateToolResult, fields{"turn_id": t.id, "tool_call_id": id, "name": call.Name, "raw_output": capLiveOutput(out),
		"output_bytes": out.size(), "status": st}, resultEvent, markTool)
	return kept
}

// showTextTx writes the text the turn said before the tool call being
// recorded, when the transcript lacks it, as an assistant row ahead of
// the call's own row, and records up to which step the transcript has
// the turn's text (for recovery). The text was stored as one row at the
// turn's end, after every tool row: session/messages showed a turn's
// tool results before the words that had introduced them, not in the
// order its followers saw. t.textShown follows the write's commit.
func (s *Server) showTextTx(ctx context.Context, tx pgx.Tx, t *turn) error {
	if t.unshown == "" {
		return nil
	}
	if _, err := appendMessageTx(ctx, tx, t.ls.id, t.id, roleAssistant, t.unshown); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "UPDATE turns SET shown_steps = $2 WHERE turn_id = $1", t.id, t.step+1)
	return err
}

// textShown records that showTextTx's write committed.
func (t *turn) textShown() {
	t.shown += len(t.unshown)
	t.unshown = ""
}

// unshownOf is the part of text, what the turn said, that is not in the
// transcript yet.
func (t *turn) unshownOf(text string) string {
	if t.shown > len(text) {
		return ""
	}
	return text[t.shown:]
}

func (s *Server) toolOutcome(ctx context.Context, t *turn, agent AgentConfig, tools *toolSet, name, id string, callEvent int64, args json.RawMessage, validArgs bool) (toolOutput, string) {
	switch {
	case tools.refused[name]:
		return wholeOutput(fmt.Sprintf("Tool `%s` is not allowed for agent `%s` (agents.%s.tools)", name, agent.Alias, agent.Alias)), toolFailed
	case !tools.has(name):
		return wholeOutput(fmt.Sprintf("Unknown tool `%s`", name)), toolFailed
	case !validArgs:
		return wholeOutput(fmt.Sprintf("Tool %s was given arguments that are not valid JSON", name)), toolFailed
	}
	if agent.needsApproval(name) {
		t.ls.mu.Lock()
		always := t.ls.alwaysAllowed[name]
		t.ls.mu.Unlock()
		if !always {
			d := s.ask(ctx, t, id, callEvent, name, args, agent.ApprovalTimeout)
			if !d.allows() {
				st := toolDenied
				if d.Decision == decisionCancelled {
					st = toolCancelled
				}
				return wholeOutput(denial(d, agent.ApprovalTimeout)), st
			}
		}
	}
	if ctx.Err() != nil {
		return wholeOutput("Cancelled: the turn ended before the tool ran"), toolCancelled
	}
	out, ok := s.execute(ctx, tools, t.principal, t.ls.id, id, name, args)
	switch {
	case ctx.Err() != nil:
		return wholeOutput("Cancelled: the turn ended while the tool ran"), toolCancelled
	case !ok:
		return out, toolFailed
	}
	return out, toolCompleted
}

// toolCall is a call as stored.
type toolCall struct {
	ID, Name  string
	Arguments json.RawMessage
}

// turnEnding, when set (tests only), runs in finish once the turn's
// loop returned, before its end is written: the gap in which the turn
// still runs for Resend though nothing of it is left to do.
var turnEnding atomic.Pointer[func(sessionID string)]

// finish records the turn's end, frees the session and publishes
// turn_complete, exactly once per turn, before Prompt can answer.
func (s *Server) finish(t *turn, res turnResult) {
	ls := t.ls
	// The number turn_complete takes, published below after the commit,
	// is stored with the turn's end: the last number used until the next
	// turn begins, which a process started after a crash answers
	// (UpdateSeqs). Nothing else publishes between.
	published := ls.nextSeq()
	unrecorded := false
	if hook := turnEnding.Load(); hook != nil {
		(*hook)(ls.id)
	}
	end := &turnEnd{sessionID: ls.id, turnID: t.id, res: res, published: published, unrecorded: t.unrecorded}
	if res.Outcome == OutcomeFailed {
		end.said = t.unshownOf(res.Said)
	} else {
		end.said = t.unshownOf(res.Content)
	}
	// The turn's end is written with its last checkpoint events: a crash
	// before this commit leaves the turn to recovery, after it never.
	if err := s.unwound(t.ctx, func(ctx context.Context) error {
		return s.cp.write(ctx, t.log, func(tx pgx.Tx) error {
			if !end.mapped {
				end.updateMap, end.mapped = t.endMap(), true
			}
			return end.writeTx(ctx, tx)
		})
	}); errors.Is(err, errTurnGone) {
		s.log.Info("turn end not recorded: its session was deleted", zap.String("session_id", ls.id), zap.String("turn_id", t.id))
	} else if err != nil {
		s.log.Warn("record turn end", zap.String("session_id", ls.id), zap.Error(err))
		unrecorded = true
	}
	spooled := false
	if unrecorded {
		end.events = s.cp.closeTaking(t.log)
		if !end.mapped {
			end.updateMap, end.mapped = t.endMap(), true
		}
		// On the disk before turn_complete tells anyone how it ended: a
		// crash from here on leaves the next start the end to write.
		spooled = s.spoolEnd(end)
	} else {
		s.cp.close(t.log)
	}

	// turn_complete is published while mu is held: the next turn cannot be
	// admitted, so cannot publish, before it.
	ls.mu.Lock()
	if unrecorded {
		s.keepUnended(t, end, spooled)
	}
	if !t.ended {
		s.completeLocked(t, res)
	}
	ls.turn = nil
	ls.mu.Unlock()
	s.flush()
	t.cancel(nil)
	close(t.done)
}

// completeLocked sets t's result, ends its approvals and publishes its
// turn_complete; t.ls.mu is held.
func (s *Server) completeLocked(t *turn, res turnResult) {
	ls := t.ls
	t.result, t.ended = res, true
	f := fields{"turn_id": t.id, "outcome": res.Outcome, "content": res.Content, "stop_reason": res.StopReason}
	if t.gen != nil {
		f["client_turn_generation"] = *t.gen
	}
	if res.Error != "" {
		f["error"] = res.Error
	}
	for _, a := range ls.approvals {
		if a.TurnID == t.id {
			ls.decideLocked(a, decision{Decision: decisionCancelled, Surface: surfaceService})
		}
	}
	s.publish(ls, UpdateTurnComplete, f)
}

// endAbandoned publishes the turn_complete of t, cancelled, when t is
// still running once its session's rows are deleted: Delete waits the
// unwind bound for a cancelled turn, and a provider that ignores its
// cancellation outlives it. The deletion's announcement, which comes
// next, detaches every connection from the session, so the turn's own
// turn_complete, published whenever its provider returned, reached
// nobody: the client that prompted never saw its turn end. The turn ends
// here, with no content (what it streamed is deleted with the session),
// and its prompt answers so when the turn's goroutine is done; finish
// publishes nothing more.
func (s *Server) endAbandoned(t *turn) {
	t.ls.mu.Lock()
	defer t.ls.mu.Unlock()
	if !t.ended {
		s.completeLocked(t, turnResult{Outcome: OutcomeCancelled, StopReason: stopCancelled})
	}
}
