package session

import (
	"context"
	"encoding/json"
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
}

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
		Summary: summarize(args), Timeout: timeout, decided: make(chan struct{}),
	}
	if err := s.unwound(ctx, func(c context.Context) error { return s.store.insertApproval(c, ls.id, t.id, a) }); err != nil {
		s.log.Warn("record approval request", zap.String("session_id", ls.id), zap.Error(err))
	}
	ls.mu.Lock()
	ls.approvals[a.RequestID] = a
	ls.mu.Unlock()
	defer func() {
		ls.mu.Lock()
		delete(ls.approvals, a.RequestID)
		ls.mu.Unlock()
	}()

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
	// goes on: so the record precedes the turn's end. A cancelled ask is
	// marked with the turn by finishTurn.
	if d.Decision != decisionCancelled {
		if err := s.unwound(ctx, func(c context.Context) error {
			if err := s.store.decideApproval(c, a.RequestID, d); err != nil {
				return err
			}
			if d.Decision == DecisionAllowAlways {
				return s.store.allowAlways(c, ls.id, tool)
			}
			return nil
		}); err != nil {
			s.log.Warn("record approval decision", zap.String("session_id", ls.id), zap.Error(err))
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

// settledAsks reads the decisions taken in memory for turn t's asks
// still pending in it, by their tool call's id: ask stores one after it
// is taken, so a Resend meanwhile would read the ask undecided.
func (s *Server) settledAsks(t *turn) map[string]decision {
	ls := t.ls
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out map[string]decision
	for _, a := range ls.approvals {
		if a.TurnID != t.id {
			continue
		}
		select {
		case <-a.decided:
		default:
			continue
		}
		if out == nil {
			out = map[string]decision{}
		}
		out[a.ToolCallID] = a.d
	}
	return out
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
