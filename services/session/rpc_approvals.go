package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/clawmesh/clawmesh/internal/ids"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Approve answers an approval request. The first decision wins, from any
// surface; a later one gets already_decided (and acknowledged false).
// The decision that wins is answered once the turn stored it (the one
// write the turn makes before it acts on it, see ask): acknowledged, or
// errDecisionNotStored when the write failed or found no row (the call
// is cancelled), or already_decided when the store's row was settled by
// another writer first.
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
		ls.mu.Unlock()
	}
	if a == nil {
		// Not pending here: an answered, expired or unknown request.
		sid, _, err := s.store.approvalStatus(ctx, reqID)
		if errors.Is(err, errNoRow) || (err == nil && sid != id) {
			return nil, errUnknownApproval(reqID)
		}
		if err != nil {
			return nil, err
		}
		resp.AlreadyDecided = true
		return resp, nil
	}
	if !ls.decide(a, d) {
		resp.AlreadyDecided = true
		return resp, nil
	}
	// The turn stores it and closes acted within its unwind bound; the
	// caller's deadline applies as well.
	select {
	case <-a.acted:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for the decision on %s to be stored: %w", reqID, ctx.Err())
	}
	ls.mu.Lock()
	stored := a.stored
	ls.mu.Unlock()
	switch {
	case stored == nil:
		resp.Acknowledged = true
	case errors.Is(stored, errApprovalSettled):
		resp.AlreadyDecided = true
	default:
		return nil, errDecisionNotStored(reqID, stored)
	}
	return resp, nil
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
