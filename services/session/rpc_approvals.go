package session

import (
	"context"
	"errors"

	"github.com/clawmesh/clawmesh/internal/ids"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Approve answers an approval request. The first decision wins, from any
// surface; a later one gets already_decided (and acknowledged false).
// Every answer says which decision stands (status, decision, surface):
// the one the turn acts on. Both wait for the one write that stores the
// decision that won (see ask), which the turn makes under its own bound,
// whatever becomes of this call: the winner is answered acknowledged, or
// errDecisionNotStored when the write failed or found no row (the call
// is cancelled), or already_decided when the store's row was settled by
// another writer first; a later decision is answered already_decided
// with what the write left standing. A caller whose deadline passes
// first is told the decision may still be recorded, and learns which
// one stands by sending it again.
func (s *Server) Approve(ctx context.Context, req *sessionv1.ApproveRequest) (*sessionv1.ApproveResponse, error) {
	id, reqID := req.GetSessionId(), req.GetRequestId()
	if err := checkApprovalIDs(id, reqID); err != nil {
		return nil, err
	}
	if _, err := s.owned(ctx, req.GetPrincipal(), id); err != nil {
		return nil, err
	}
	d := decision{Decision: decisionWords[req.GetDecision()], Surface: surfaceWords[req.GetSurface()], Replacement: req.GetReplacement()}
	if d.Decision == "" {
		return nil, errInvalid("`decision` must be one of allow_once, allow_always, reject, reject_with_edit")
	}
	if req.GetSurface() == sessionv1.Surface_SURFACE_UNSPECIFIED {
		d.Surface = SurfaceRPC
	} else if d.Surface == "" {
		return nil, errInvalid("`surface` must be one of rpc, elicitation, durable")
	}
	resp := &sessionv1.ApproveResponse{SessionId: id, RequestId: reqID}

	var a *approval
	ls := s.lookupLive(id)
	if ls != nil {
		ls.mu.Lock()
		a = ls.approvals[reqID]
		if a == nil && ls.turn != nil {
			// Acted on by the turn still running: its row may
			// still read pending (a decision not stored is marked
			// cancelled at the turn's end).
			a = ls.turn.asked[reqID]
		}
		ls.mu.Unlock()
	}
	if a == nil {
		// Not asked here: an answered, expired or unknown request, or
		// one of a turn that ended; its row says what stands.
		sid, status, stands, err := s.store.approvalStatus(ctx, reqID)
		if errors.Is(err, errNoRow) || (err == nil && sid != id) {
			return nil, errUnknownApproval(reqID)
		}
		if err != nil {
			return nil, err
		}
		resp.AlreadyDecided = true
		standing(resp, stands, status)
		return resp, nil
	}
	won := ls.decide(a, d)
	// The turn stores the decision that won and closes acted within its
	// unwind bound; the caller's deadline applies to the wait only.
	select {
	case <-a.acted:
	case <-ctx.Done():
		return nil, errDecisionPending(reqID, ctx.Err())
	}
	ls.mu.Lock()
	stored, stands := a.stored, a.stands
	ls.mu.Unlock()
	standing(resp, stands, "decided")
	switch {
	case !won || errors.Is(stored, errApprovalSettled):
		resp.AlreadyDecided = true
	case stored == nil:
		resp.Acknowledged = true
	default:
		return nil, errDecisionNotStored(reqID, stored)
	}
	return resp, nil
}

// standing sets resp's standing decision from d, as stored with status
// (or taken in memory: "decided"). The service's own outcomes (timeout,
// cancelled) are their status alone; a cancelled row keeps the decision
// whose write it undid, which does not stand.
func standing(resp *sessionv1.ApproveResponse, d decision, status string) {
	resp.Status = decisionStatus(d.Decision, status)
	if resp.Status == sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED {
		resp.Decision, resp.Surface = decisionEnum(d.Decision), surfaceEnum(d.Surface)
	}
}

// checkApprovalIDs checks the ids an approval call names before either
// reaches SQL (the gateway checks them too; the durable bridge and any
// other caller of the service are checked here).
func checkApprovalIDs(sessionID, requestID string) error {
	if sessionID != "" {
		// An empty one is refused by owned, after the principal.
		if err := ids.Check(sessionID); err != nil {
			return errInvalid("`session_id` " + err.Error())
		}
	}
	if err := ids.Check(requestID); err != nil {
		return errInvalid("`request_id` " + err.Error())
	}
	return nil
}
