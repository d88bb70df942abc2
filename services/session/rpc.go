package session

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/internal/bus"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Paging bounds of Messages and List.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 1000
)

var errShuttingDown = status.Error(codes.Unavailable, "session service shutting down")

func requirePrincipal(p *commonv1.Principal) error {
	if p.GetPrincipalId() == "" {
		return errInvalid("`principal` is required")
	}
	return nil
}

func owns(p *commonv1.Principal, row sessionRow) bool {
	return p.GetOperator() || row.Owner == p.GetPrincipalId()
}

// owned reads a session the principal may act on.
func (s *Server) owned(ctx context.Context, p *commonv1.Principal, id string) (sessionRow, error) {
	return s.ownedBy(ctx, p, id, s.store.session)
}

// ownedBy is owned with the row read by read.
func (s *Server) ownedBy(ctx context.Context, p *commonv1.Principal, id string, read func(context.Context, string) (sessionRow, error)) (sessionRow, error) {
	if err := requirePrincipal(p); err != nil {
		return sessionRow{}, err
	}
	if id == "" {
		return sessionRow{}, errInvalid("`session_id` is required")
	}
	row, err := read(ctx, id)
	if errors.Is(err, errNoRow) {
		return row, errSessionNotFound(id)
	}
	if err != nil {
		return row, err
	}
	if !owns(p, row) {
		return row, errSessionNotOwned(id)
	}
	return row, nil
}

func pageLimit(field string, limit int64) (int64, error) {
	switch {
	case limit == 0:
		return DefaultPageLimit, nil
	case limit < 0 || limit > MaxPageLimit:
		return 0, errInvalid(fmt.Sprintf("`%s` must be between 1 and %d", field, MaxPageLimit))
	}
	return limit, nil
}

func toProto(r sessionRow, state string) *sessionv1.Session {
	return &sessionv1.Session{
		SessionId: r.ID, AgentAlias: r.AgentAlias, Owner: r.Owner, State: stateEnum[state], MessageCount: r.MessageCount,
		WorkspaceDir: r.WorkspaceDir, InteractionSurface: r.Surface, Title: r.Title,
		CreatedAt: timestamppb.New(r.CreatedAt), UpdatedAt: timestamppb.New(r.UpdatedAt),
	}
}

// stateEnum maps the stored states to the contract's enum.
var stateEnum = map[string]sessionv1.SessionState{
	stateIdle:    sessionv1.SessionState_SESSION_STATE_IDLE,
	stateRunning: sessionv1.SessionState_SESSION_STATE_RUNNING,
	stateClosed:  sessionv1.SessionState_SESSION_STATE_CLOSED,
	stateKilled:  sessionv1.SessionState_SESSION_STATE_KILLED,
}

// outcomeEnum maps the turn outcomes to the contract's enum.
var outcomeEnum = map[string]sessionv1.TurnOutcome{
	OutcomeCompleted: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED,
	OutcomeCancelled: sessionv1.TurnOutcome_TURN_OUTCOME_CANCELLED,
	OutcomeFailed:    sessionv1.TurnOutcome_TURN_OUTCOME_FAILED,
}

// updateSubject is the bus subject of a stored session's updates.
func updateSubject(id string, incarnation int64) (string, error) {
	subject, err := bus.SessionUpdateSubject(id, incarnation)
	if err != nil {
		return "", fmt.Errorf("session %q: %w", id, err)
	}
	return subject, nil
}
