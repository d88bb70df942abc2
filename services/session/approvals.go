package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/ids"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Decisions of session/approve, and the two the service takes itself.
const (
	DecisionAllowOnce      = "allow_once"
	DecisionAllowAlways    = "allow_always"
	DecisionReject         = "reject"
	DecisionRejectWithEdit = "reject_with_edit"
	decisionTimeout        = "timeout"
	decisionCancelled      = "cancelled"
)

// Surfaces that may answer an approval.
const (
	SurfaceRPC         = "rpc"
	SurfaceElicitation = "elicitation"
	SurfaceDurable     = "durable"
	surfaceService     = "service"
)

// decisionWords and surfaceWords map the contract's enums to the words
// stored and published.
var (
	decisionWords = map[sessionv1.Decision]string{
		sessionv1.Decision_DECISION_ALLOW_ONCE:       DecisionAllowOnce,
		sessionv1.Decision_DECISION_ALLOW_ALWAYS:     DecisionAllowAlways,
		sessionv1.Decision_DECISION_REJECT:           DecisionReject,
		sessionv1.Decision_DECISION_REJECT_WITH_EDIT: DecisionRejectWithEdit,
	}
	surfaceWords = map[sessionv1.Surface]string{
		sessionv1.Surface_SURFACE_RPC:         SurfaceRPC,
		sessionv1.Surface_SURFACE_ELICITATION: SurfaceElicitation,
		sessionv1.Surface_SURFACE_DURABLE:     SurfaceDurable,
	}
)

type decision struct {
	Decision, Surface, Replacement string
	// note is the tool result of a call whose ask ended cancelled for
	// another reason than its turn's end (unrecordedNote, see ask).
	note string
}

// unrecordedNote is the tool result of a call whose approval's decision
// could not be stored.
const unrecordedNote = "Cancelled: the approval's decision could not be recorded (session storage unavailable)"

// settledNote is the tool result of a call whose approval was no longer
// pending in the store when its decision was to be stored (another
// writer settled it).
const settledNote = "Cancelled: the approval was already settled in session storage when its decision was recorded"

func (d decision) allows() bool {
	return d.Decision == DecisionAllowOnce || d.Decision == DecisionAllowAlways
}

// approval is one pending ask. The first decision wins: decide sets d and
// closes decided under the session's mu, once.
type approval struct {
	RequestID, ToolCallID, ToolName, Summary string
	TurnID                                   string
	Timeout                                  time.Duration

	decided chan struct{}
	d       decision
	// acted is closed once the turn took the decision it acts on (see
	// turn.acted), after storing it. stored and stands, set under the
	// session's mu before, are what Approve answers from: stored is nil
	// when the decision that won was stored, else why not (the store's
	// error); stands is the decision the turn acts on (the one that won,
	// or cancelled when it was not stored).
	acted  chan struct{}
	stored error
	stands decision
}

// decide records d for a unless an earlier decision won; it reports
// whether d won.
func (ls *liveSession) decide(a *approval, d decision) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.decideLocked(a, d)
}

func (ls *liveSession) decideLocked(a *approval, d decision) bool {
	select {
	case <-a.decided:
		return false
	default:
	}
	a.d = d
	close(a.decided)
	if d.Decision == DecisionAllowAlways {
		ls.alwaysAllowed[a.ToolName] = true
	}
	return true
}

// ask publishes an approval request for a call, whose checkpoint event
// is callEvent, and waits for the first decision: a person's (Approve),
// the timeout's (denied) or the turn's end (cancelled).
func (s *Server) ask(ctx context.Context, t *turn, callID string, callEvent int64, tool string, args json.RawMessage, timeout time.Duration) decision {
	ls := t.ls
	a := &approval{
		RequestID: ids.New("ap_"), ToolCallID: callID, ToolName: tool, TurnID: t.id,
		Summary: summarize(args), Timeout: timeout, decided: make(chan struct{}), acted: make(chan struct{}),
	}
	if err := s.unwound(ctx, func(c context.Context) error { return s.store.insertApproval(c, ls.id, t.id, a) }); err != nil {
		s.log.Warn("record approval request", zap.String("session_id", ls.id), zap.Error(err))
	}
	ls.mu.Lock()
	ls.approvals[a.RequestID] = a
	ls.mu.Unlock()

	t.publishMapped(s, UpdateApprovalRequest, a.request(t.id), callEvent, markApproval)

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var own decision
	select {
	case <-a.decided:
	case <-timer.C:
		own = decision{Decision: decisionTimeout, Surface: surfaceService}
	case <-ctx.Done():
		own = decision{Decision: decisionCancelled, Surface: surfaceService}
	}
	if own.Decision != "" {
		ls.decide(a, own)
	}
	ls.mu.Lock()
	d := a.d
	ls.mu.Unlock()
	// The turn records the decision that won, whoever gave it, before it
	// acts on it: so the record precedes the call and the turn's end. A
	// cancelled ask is marked with the turn by finishTurnTx.
	var stored error
	if d.Decision != decisionCancelled {
		if err := s.unwound(ctx, func(c context.Context) error { return s.store.decideApproval(c, ls.id, a.RequestID, d) }); err != nil {
			// Not stored, it is not acted on: the call ends cancelled,
			// as the row will say once the turn's end (or the recovery
			// after a crash) marks it, and as a resend says meanwhile
			// (t.acted). Acting on it left the record saying the
			// service cancelled a call that ran on a person's
			// decision. An UPDATE that matched no pending row stored
			// nothing either: no row (its insert failed), or one
			// another writer settled. Approve, which waits for this,
			// answers the person so (a.stored); the call's tool_result
			// says why it did not run.
			stored = err
			s.log.Warn("record approval decision", zap.String("session_id", ls.id), zap.String("request_id", a.RequestID), zap.Error(err))
			if d.Decision == DecisionAllowAlways {
				// The tool was not allowed always when this ask
				// began (toolOutcome asks only then): its decision
				// set it.
				ls.mu.Lock()
				delete(ls.alwaysAllowed, tool)
				ls.mu.Unlock()
			}
			note := unrecordedNote
			if errors.Is(err, errApprovalSettled) {
				note = settledNote
			}
			d = decision{Decision: decisionCancelled, Surface: surfaceService, note: note}
			t.unrecorded = append(t.unrecorded, a.RequestID)
		}
	}
	// Forgotten as pending and kept as what the turn acts on in one
	// step: a Resend finds it in one or the other. Approve answers from
	// here: after the one write that stores the decision.
	ls.mu.Lock()
	delete(ls.approvals, a.RequestID)
	if t.acted == nil {
		t.acted = map[string]decision{}
		t.asked = map[string]*approval{}
	}
	t.acted[callID] = d
	t.asked[a.RequestID] = a
	a.stored, a.stands = stored, d
	close(a.acted)
	ls.mu.Unlock()
	if d.Decision == DecisionAllowAlways {
		// After Approve's answer: the decision is stored, so this call
		// runs whatever this write does, and a later one of this
		// process's is not asked; after a restart, if this write
		// failed, it is asked again.
		if err := s.unwound(ctx, func(c context.Context) error { return s.store.allowAlways(c, ls.id, tool) }); err != nil {
			s.log.Warn("record allow_always", zap.String("session_id", ls.id), zap.Error(err))
		}
	}
	s.log.Info("approval decided", zap.String("session_id", ls.id), zap.String("request_id", a.RequestID),
		zap.String("decision", d.Decision), zap.String("surface", d.Surface))
	return d
}

// request is a's approval_request update, of turn turnID.
func (a *approval) request(turnID string) fields {
	return fields{
		"turn_id":           turnID,
		"request_id":        a.RequestID,
		"tool_call_id":      a.ToolCallID,
		"tool_name":         a.ToolName,
		"arguments_summary": a.Summary,
		"timeout_secs":      a.timeoutSecs(),
	}
}

// resent is a's approval_request as Resend sends it again: as it was
// published, and, once a decision settled it (a.d, as stored or taken
// in memory), that decision and who gave it (decision, decided_by: the
// surface, "service" for the timeout and a turn's end), so that the
// gateway does not put to a client an ask nobody can answer any more.
// SPEC's approval_request has no such field and no update reports a
// decision: without them a follower that missed the ask, or one that
// rejoined, was asked again for what was already settled.
func (a *approval) resent(turnID string) fields {
	f := a.request(turnID)
	if a.d.Decision != "" {
		f["decision"] = a.d.Decision
		f["decided_by"] = a.d.Surface
	}
	return f
}

// settleAsks gives each of asks, turn t's by their tool call's id as
// stored, the decision the turn acted on (t.acted), which wins over the
// stored one: the row of an ask cancelled, or whose decision could not be
// stored, is pending until the turn's end. An ask decided whose decision
// is being stored is waited for (ask's write, within the unwind bound):
// until it is stored the turn has not acted on it, and one not stored is
// cancelled instead (see ask); reading it decided from memory sent again
// a decision the turn was about to undo. t.acted only grows while the
// turn runs, so asks may have been read before or after.
func (s *Server) settleAsks(ctx context.Context, t *turn, asks map[string]*approval) error {
	ls := t.ls
	for {
		ls.mu.Lock()
		var storing chan struct{}
		for _, a := range ls.approvals {
			if a.TurnID != t.id {
				continue
			}
			select {
			case <-a.decided:
				storing = a.acted
			default:
			}
		}
		if storing == nil {
			for callID, d := range t.acted {
				if a := asks[callID]; a != nil {
					a.d = d
				}
			}
			ls.mu.Unlock()
			return nil
		}
		ls.mu.Unlock()
		select {
		case <-storing:
		case <-ctx.Done():
			return fmt.Errorf("wait for an approval's decision to be stored: %w", context.Cause(ctx))
		}
	}
}

// timeoutSecs is a's timeout in whole seconds, rounded up.
func (a *approval) timeoutSecs() int64 {
	return int64((a.Timeout + time.Second - 1) / time.Second)
}

// denial is the tool result of a call that did not run.
func denial(d decision, timeout time.Duration) string {
	switch d.Decision {
	case DecisionReject:
		return "Denied: the user rejected this tool call"
	case DecisionRejectWithEdit:
		if d.Replacement != "" {
			return "Denied: the user rejected this tool call and answered instead: " + d.Replacement
		}
		return "Denied: the user rejected this tool call"
	case decisionTimeout:
		return fmt.Sprintf("Denied: no approval within %d seconds", int64((timeout+time.Second-1)/time.Second))
	default:
		if d.note != "" {
			return d.note
		}
		return "Cancelled: the turn ended before a decision"
	}
}

// summarize shortens a call's arguments for an approval prompt.
func summarize(args json.RawMessage) string {
	const limit = 200
	s := string(args)
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8Start(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
