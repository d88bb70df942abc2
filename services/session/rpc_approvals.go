package session

import (
	"context"
	"errors"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Approve answers an approval request. The first decision wins, from any
// surface; a later one gets already_decided (and acknowledged false).
func (s *Server) Approve(ctx context.Context, req *sessionv1.ApproveRequest) (*sessionv1.ApproveResponse, error) {
	id, reqID := req.GetSessionId(), req.GetRequestId()
	if _, err := s.owned(ctx, req.GetPrincipal(), id); err != nil {
		return nil, err
	}
	if reqID == "" {
		return nil, errInvalid("`request_id` is required")
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
	resp.Acknowledged = true
	return resp, nil
}
