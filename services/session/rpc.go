package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
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
	if err := requirePrincipal(p); err != nil {
		return sessionRow{}, err
	}
	if id == "" {
		return sessionRow{}, errInvalid("`session_id` is required")
	}
	row, err := s.store.session(ctx, id)
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
func updateSubject(id string) (string, error) {
	subject, err := bus.SessionUpdateSubject(id)
	if err != nil {
		return "", fmt.Errorf("session %q: %w", id, err)
	}
	return subject, nil
}

// NewSession creates a session, or resumes the durable session named by
// session_id (a closed one is reopened in a new generation; a killed one
// cannot be). A session_id that names no session creates it with that id.
func (s *Server) NewSession(ctx context.Context, req *sessionv1.NewSessionRequest) (*sessionv1.NewSessionResponse, error) {
	p := req.GetPrincipal()
	if err := requirePrincipal(p); err != nil {
		return nil, err
	}
	id := req.GetSessionId()
	if id != "" && !ids.Token(id) {
		return nil, errInvalid("`session_id` " + ids.ErrFormat.Error())
	}
	surface := req.GetInteractionSurface()
	if surface == "" {
		surface = SurfaceRPC
	}
	if len(surface) > 64 {
		return nil, errInvalid("`interaction_surface` is longer than 64 bytes")
	}
	alias := req.GetAgentAlias()
	if alias == "" {
		alias = DefaultAgentAlias
	}

	if id != "" {
		resp, err := s.resume(ctx, p, id, req.GetCwd())
		if err == nil || !errors.Is(err, errNoRow) {
			return resp, err
		}
	}
	if _, err := s.cfg.Agents.Agent(ctx, alias); err != nil {
		if errors.Is(err, ErrUnknownAgent) {
			return nil, errInvalid(fmt.Sprintf("Unknown agent_alias `%s`", alias))
		}
		s.log.Warn("resolve agent", zap.String("agent_alias", alias), zap.Error(err))
		return nil, status.Error(codes.Unavailable, "config service unavailable")
	}
	if err := s.mayUseAgent(ctx, p, alias); err != nil {
		return nil, err
	}
	if id == "" {
		id = ids.New("sess_")
	}
	dir := filepath.Join(s.cfg.DataDir, "workspaces", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create session workspace: %w", err)
	}
	row := sessionRow{ID: id, AgentAlias: alias, Owner: p.GetPrincipalId(), Surface: surface, WorkspaceDir: dir, Cwd: req.GetCwd()}
	created, err := s.store.createSession(ctx, row)
	if err != nil {
		return nil, err
	}
	if !created {
		// Someone created this id meanwhile: resume it like any other.
		return s.resume(ctx, p, id, req.GetCwd())
	}
	s.log.Info("session created", zap.String("session_id", id), zap.String("agent_alias", alias), zap.String("owner", row.Owner))
	subject, err := updateSubject(id)
	if err != nil {
		return nil, err
	}
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: alias, WorkspaceDir: dir, UpdateSubject: subject}, nil
}

// resume returns an existing session, reopening a closed one; errNoRow
// when there is none.
func (s *Server) resume(ctx context.Context, p *commonv1.Principal, id, cwd string) (*sessionv1.NewSessionResponse, error) {
	row, err := s.store.session(ctx, id)
	if err != nil {
		return nil, err
	}
	if !owns(p, row) {
		return nil, errSessionNotOwned(id)
	}
	if ls := s.lookupLive(id); ls != nil {
		ls.mu.Lock()
		deleting := ls.deleting
		ls.mu.Unlock()
		if deleting {
			return nil, errSessionNotFound(id)
		}
	}
	switch row.State {
	case stateKilled:
		return nil, errSessionEnded(id, row.State)
	case stateClosed:
		reopened, err := s.store.reopen(ctx, id, cwd)
		if errors.Is(err, errNoRow) {
			// Killed or deleted meanwhile.
			return nil, errSessionNotFound(id)
		}
		if err != nil {
			return nil, err
		}
		row = reopened
		s.log.Info("session reopened", zap.String("session_id", id), zap.Int64("generation", row.Generation))
	}
	if err := os.MkdirAll(row.WorkspaceDir, 0o700); err != nil {
		return nil, fmt.Errorf("create session workspace: %w", err)
	}
	subject, err := updateSubject(id)
	if err != nil {
		return nil, err
	}
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: row.AgentAlias, MessageCount: row.MessageCount,
		WorkspaceDir: row.WorkspaceDir, UpdateSubject: subject}, nil
}

// Prompt runs one turn and answers when it ends, after its turn_complete
// was published. A session runs one turn at a time: a prompt during a
// running turn is SESSION_BUSY. The turn is cancelled when this call's
// context ends, when its connection closes (ConnectionClosed), by Cancel,
// or when the session is closed, killed or deleted.
func (s *Server) Prompt(ctx context.Context, req *sessionv1.PromptRequest) (*sessionv1.PromptResponse, error) {
	id := req.GetSessionId()
	prompt := req.GetPrompt()
	if strings.TrimSpace(prompt) == "" && len(req.GetAttachments()) == 0 {
		if err := requirePrincipal(req.GetPrincipal()); err != nil {
			return nil, err
		}
		return nil, errInvalid("`prompt` is required")
	}
	row, err := s.owned(ctx, req.GetPrincipal(), id)
	if err != nil {
		return nil, err
	}
	// Attachments must be files stored in this session (files.go).
	if prompt, err = s.withAttachments(ctx, row.ID, row.WorkspaceDir, prompt, req.GetAttachments()); err != nil {
		return nil, err
	}
	// Checked on every turn: a grant revoked since session/new stops the
	// next turn.
	if err := s.mayUseAgent(ctx, req.GetPrincipal(), row.AgentAlias); err != nil {
		return nil, err
	}
	ls := s.live(row)
	t, err := s.admit(ctx, ls, req, prompt)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { t.cancel(ErrCallerGone) })
	defer stop()
	<-t.done
	return &sessionv1.PromptResponse{
		SessionId: id, TurnId: t.id, Outcome: outcomeEnum[t.result.Outcome], StopReason: t.result.StopReason, Content: t.result.Content,
	}, nil
}

// admit starts a turn on ls unless one is running or the session ended.
func (s *Server) admit(ctx context.Context, ls *liveSession, req *sessionv1.PromptRequest, prompt string) (*turn, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.deleting {
		return nil, errSessionNotFound(ls.id)
	}
	if ls.turn != nil {
		return nil, errSessionBusy(ls.id)
	}
	// Read again under the lock: the state may have changed since.
	row, err := s.store.session(ctx, ls.id)
	if errors.Is(err, errNoRow) {
		return nil, errSessionNotFound(ls.id)
	}
	if err != nil {
		return nil, err
	}
	if row.State == stateClosed || row.State == stateKilled {
		return nil, errSessionEnded(ls.id, row.State)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errShuttingDown
	}
	s.wg.Add(1)
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.wg.Done()
		}
	}()

	t := &turn{
		id: ids.New("turn_"), ls: ls, alias: row.AgentAlias, principal: req.GetPrincipal(),
		connID: req.GetConnectionId(), done: make(chan struct{}),
	}
	if req.ClientTurnGeneration != nil {
		g := req.GetClientTurnGeneration()
		t.gen = &g
	}
	t.ctx, t.cancel = context.WithCancelCause(s.base)
	if err := s.store.startTurn(ctx, ls.id, t.id, t.connID, t.gen); err != nil {
		t.cancel(nil)
		return nil, err
	}
	if _, err := s.store.appendMessage(ctx, ls.id, roleUser, prompt); err != nil {
		// The turn row exists: end it properly rather than leave it running.
		t.cancel(err)
		_ = s.unwound(ctx, func(c context.Context) error {
			return s.store.finishTurn(c, ls.id, t.id, turnResult{Outcome: OutcomeFailed, StopReason: stopError})
		})
		return nil, err
	}
	ls.turn = t
	started = true
	go s.runTurn(t)
	return t, nil
}

// Cancel cancels the running turn, if any, and waits (bounded) for it to
// end: afterwards the session reads idle.
func (s *Server) Cancel(ctx context.Context, req *sessionv1.CancelRequest) (*sessionv1.CancelResponse, error) {
	if _, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId()); err != nil {
		return nil, err
	}
	resp := &sessionv1.CancelResponse{SessionId: req.GetSessionId()}
	if ls := s.lookupLive(req.GetSessionId()); ls != nil {
		if t := ls.running(); t != nil {
			s.stopTurn(ctx, t, ErrCancelRequested)
			resp.Cancelled = true
		}
	}
	return resp, nil
}

// ConnectionClosed cancels every turn the connection started and waits
// (bounded) for them to end.
func (s *Server) ConnectionClosed(ctx context.Context, req *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	conn := req.GetConnectionId()
	if conn == "" {
		return nil, errInvalid("`connection_id` is required")
	}
	s.mu.Lock()
	lives := make([]*liveSession, 0, len(s.lives))
	for _, ls := range s.lives {
		lives = append(lives, ls)
	}
	s.mu.Unlock()
	var turns []*turn
	for _, ls := range lives {
		if t := ls.running(); t != nil && t.connID == conn {
			t.cancel(ErrConnectionClosed)
			turns = append(turns, t)
		}
	}
	for _, t := range turns {
		s.stopTurn(ctx, t, ErrConnectionClosed)
	}
	return &sessionv1.ConnectionClosedResponse{CancelledTurns: int32(len(turns))}, nil
}

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

// State reports idle, running (with the turn id), closed or killed.
func (s *Server) State(ctx context.Context, req *sessionv1.StateRequest) (*sessionv1.StateResponse, error) {
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.StateResponse{SessionId: row.ID, State: stateEnum[s.stateOf(row)]}
	if ls := s.lookupLive(row.ID); ls != nil {
		if t := ls.running(); t != nil {
			resp.TurnId = t.id
		}
	}
	return resp, nil
}

// stateOf is the stored state, with running taken from memory: a stored
// running without a turn here is left over from a dead process.
func (s *Server) stateOf(row sessionRow) string {
	if row.State != stateIdle && row.State != stateRunning {
		return row.State
	}
	if ls := s.lookupLive(row.ID); ls != nil && ls.running() != nil {
		return stateRunning
	}
	return stateIdle
}

// Messages pages through the visible transcript, oldest first: the last
// limit rows (default 50, at most 1000) before before_index when given,
// and the transcript's total length. Indexes never change.
func (s *Server) Messages(ctx context.Context, req *sessionv1.MessagesRequest) (*sessionv1.MessagesResponse, error) {
	if _, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId()); err != nil {
		return nil, err
	}
	limit, err := pageLimit("limit", req.GetLimit())
	if err != nil {
		return nil, err
	}
	before := int64(-1)
	if req.BeforeIndex != nil {
		if req.GetBeforeIndex() < 0 {
			return nil, errInvalid("`before_index` must not be negative")
		}
		before = req.GetBeforeIndex()
	}
	msgs, total, err := s.store.messages(ctx, req.GetSessionId(), limit, before)
	if errors.Is(err, errNoRow) {
		return nil, errSessionNotFound(req.GetSessionId())
	}
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.MessagesResponse{SessionId: req.GetSessionId(), Total: total, Messages: make([]*sessionv1.Message, 0, len(msgs))}
	for _, m := range msgs {
		resp.Messages = append(resp.Messages, &sessionv1.Message{Index: m.Index, Role: m.Role, Content: m.Content})
	}
	return resp, nil
}

// List lists the caller's sessions (every session for the operator),
// most recently active first, open ones unless include_closed.
func (s *Server) List(ctx context.Context, req *sessionv1.ListRequest) (*sessionv1.ListResponse, error) {
	p := req.GetPrincipal()
	if err := requirePrincipal(p); err != nil {
		return nil, err
	}
	limit, err := pageLimit("limit", req.GetLimit())
	if err != nil {
		return nil, err
	}
	owner := p.GetPrincipalId()
	if p.GetOperator() {
		owner = ""
	}
	rows, err := s.store.listSessions(ctx, owner, limit, req.GetIncludeClosed())
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.ListResponse{Sessions: make([]*sessionv1.Session, 0, len(rows))}
	for _, r := range rows {
		resp.Sessions = append(resp.Sessions, toProto(r, s.stateOf(r)))
	}
	return resp, nil
}

// Close ends a session's use and keeps its durable history: a running turn
// is cancelled, and session/new with its id reopens it.
func (s *Server) Close(ctx context.Context, req *sessionv1.CloseRequest) (*sessionv1.CloseResponse, error) {
	if err := s.endSession(ctx, req.GetPrincipal(), req.GetSessionId(), stateClosed); err != nil {
		return nil, err
	}
	return &sessionv1.CloseResponse{SessionId: req.GetSessionId(), Closed: true}, nil
}

// Kill cancels a running turn and tombstones the session: its history
// stays readable, it never runs again.
func (s *Server) Kill(ctx context.Context, req *sessionv1.KillRequest) (*sessionv1.KillResponse, error) {
	if err := s.endSession(ctx, req.GetPrincipal(), req.GetSessionId(), stateKilled); err != nil {
		return nil, err
	}
	return &sessionv1.KillResponse{SessionId: req.GetSessionId(), Killed: true}, nil
}

func (s *Server) endSession(ctx context.Context, p *commonv1.Principal, id, state string) error {
	row, err := s.owned(ctx, p, id)
	if err != nil {
		return err
	}
	if state == stateClosed && row.State == stateKilled {
		return errSessionEnded(row.ID, row.State)
	}
	ls := s.live(row)
	ls.mu.Lock()
	from := []string{stateIdle, stateRunning, stateClosed}
	if state == stateClosed {
		from = []string{stateIdle, stateRunning}
	}
	if _, err := s.store.setState(ctx, row.ID, state, from...); err != nil {
		ls.mu.Unlock()
		return err
	}
	t := ls.turn
	ls.mu.Unlock()
	if t != nil {
		s.stopTurn(ctx, t, fmt.Errorf("%w: %s", ErrSessionEnded, state))
	}
	s.log.Info("session ended", zap.String("session_id", row.ID), zap.String("state", state))
	return nil
}

// Delete cancels a running turn, then removes the session's rows (its
// transcript, turns, tool calls, approvals) and its workspace. If the rows
// cannot be removed the session stays as it was, minus the cancelled turn.
func (s *Server) Delete(ctx context.Context, req *sessionv1.DeleteRequest) (*sessionv1.DeleteResponse, error) {
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	ls := s.live(row)
	ls.mu.Lock()
	if ls.deleting {
		ls.mu.Unlock()
		return nil, errSessionNotFound(row.ID)
	}
	ls.deleting = true
	t := ls.turn
	ls.mu.Unlock()
	if t != nil {
		s.stopTurn(ctx, t, fmt.Errorf("%w: deleted", ErrSessionEnded))
	}
	if _, err := s.store.deleteSession(ctx, row.ID); err != nil {
		ls.mu.Lock()
		ls.deleting = false
		ls.mu.Unlock()
		return nil, err
	}
	s.forget(row.ID)
	if err := os.RemoveAll(filepath.Join(s.cfg.DataDir, "workspaces", row.ID)); err != nil {
		s.log.Warn("remove session workspace", zap.String("session_id", row.ID), zap.Error(err))
	}
	// The id is free now and may next name another principal's session:
	// every gateway detaches its connections from it.
	if err := bus.PublishSessionUpdate(s.nc, &busv1.SessionUpdate{SessionId: row.ID, Type: busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED}); err != nil {
		s.log.Warn("announce session deletion", zap.String("session_id", row.ID), zap.Error(err))
	}
	s.log.Info("session deleted", zap.String("session_id", row.ID))
	return &sessionv1.DeleteResponse{SessionId: row.ID, Deleted: true}, nil
}

// Attach checks that the principal may follow the session and names the
// NATS subject of its updates.
func (s *Server) Attach(ctx context.Context, req *sessionv1.AttachRequest) (*sessionv1.AttachResponse, error) {
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	subject, err := updateSubject(row.ID)
	if err != nil {
		return nil, err
	}
	return &sessionv1.AttachResponse{SessionId: row.ID, Subject: subject}, nil
}

// Status counts the sessions that are open (idle or running) and lists
// those the principal owns (all of them for the operator).
func (s *Server) Status(ctx context.Context, req *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	open, err := s.store.openSessions(ctx)
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.StatusResponse{ActiveSessions: int64(len(open)), SessionIds: []string{}}
	for _, o := range open {
		if req.GetPrincipal().GetOperator() || o.Owner == req.GetPrincipal().GetPrincipalId() {
			resp.SessionIds = append(resp.SessionIds, o.ID)
		}
	}
	return resp, nil
}
