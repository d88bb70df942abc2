package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// maxCwdBytes bounds a session's cwd.
const maxCwdBytes = 4096

// NewSession creates a session, or resumes the durable session named by
// session_id (a closed one is reopened in a new generation; a killed one
// cannot be; one of another interaction surface is not touched). A
// session_id that names no session creates it with that id.
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
	// A path is at most PATH_MAX (4096) bytes on Linux; a longer cwd is
	// no path, only megabytes kept in every session row.
	if n := len(req.GetCwd()); n > maxCwdBytes {
		return nil, errInvalid(fmt.Sprintf("`cwd` is %d bytes; the limit is %d", n, maxCwdBytes))
	}
	alias := req.GetAgentAlias()
	if alias == "" {
		alias = DefaultAgentAlias
	}
	maxOfSurface := int(req.GetMaxOpenOfSurface())
	if maxOfSurface < 0 {
		return nil, errInvalid("`max_open_of_surface` is negative")
	}

	if id != "" {
		resp, err := s.resume(ctx, p, id, req.GetCwd(), surface, maxOfSurface)
		if err == nil || !errors.Is(err, errNoRow) {
			return resp, err
		}
	}
	_, err := s.cfg.Agents.Agent(ctx, alias)
	if errors.Is(err, ErrUnknownAgent) && req.GetConfigRevision() > 0 {
		err = s.agentAt(ctx, alias, req.GetConfigRevision())
	}
	if err != nil {
		if errors.Is(err, ErrUnknownAgent) {
			return nil, errInvalid(fmt.Sprintf("Unknown agent_alias `%s`", alias))
		}
		s.log.Warn("resolve agent", zap.String("agent_alias", alias), zap.Error(err))
		return nil, configError(err)
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
	incarnation, err := s.store.createSession(ctx, row, maxOfSurface)
	if errors.Is(err, errSurfaceBusy) {
		_ = os.Remove(dir)
		return nil, errSurfaceAllBusy(surface)
	}
	if errors.Is(err, errOpenLimit) || errors.Is(err, errKeptLimit) {
		_ = os.Remove(dir) // the folder made above, if it is empty
		switch {
		case errors.Is(err, errKeptLimit):
			return nil, errKeptSessionLimit()
		case errors.Is(err, errChannelOpenLimit):
			return nil, errChannelSessionLimit()
		}
		return nil, errSessionLimit()
	}
	if err != nil {
		return nil, err
	}
	if incarnation == 0 {
		// Someone created this id meanwhile: resume it like any other.
		return s.resume(ctx, p, id, req.GetCwd(), surface, maxOfSurface)
	}
	s.log.Info("session created", zap.String("session_id", id), zap.String("agent_alias", alias), zap.String("owner", row.Owner))
	subject, err := updateSubject(id, incarnation)
	if err != nil {
		return nil, err
	}
	// Made a moment ago, it has published nothing.
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: alias, WorkspaceDir: dir, UpdateSubject: subject, Created: true,
		UpdateSeq: proto.Int64(0)}, nil
}

// resume returns an existing session, reopening a closed one; errNoRow
// when there is none. A session of another interaction surface (a
// channel's chat with this id, say) stays as it is, isolated from this
// one: resuming it from here is refused. maxOfSurface is admitOpen's,
// for a closed one reopened.
func (s *Server) resume(ctx context.Context, p *commonv1.Principal, id, cwd, surface string, maxOfSurface int) (*sessionv1.NewSessionResponse, error) {
	row, err := s.store.session(ctx, id)
	if err != nil {
		return nil, err
	}
	if !owns(p, row) {
		return nil, errSessionNotOwned(id)
	}
	if row.Surface != surface {
		return nil, errOtherSurface(id, row.Surface)
	}
	if ls := s.lookupLive(id); ls != nil && ls.incarnation == row.Incarnation {
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
		reopened, err := s.store.reopen(ctx, id, row.Owner, row.Surface, cwd, maxOfSurface)
		if errors.Is(err, errSurfaceBusy) {
			return nil, errSurfaceAllBusy(surface)
		}
		if errors.Is(err, errChannelOpenLimit) {
			return nil, errChannelSessionLimit()
		}
		if errors.Is(err, errOpenLimit) {
			return nil, errSessionLimit()
		}
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
	subject, err := updateSubject(id, row.Incarnation)
	if err != nil {
		return nil, err
	}
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: row.AgentAlias, MessageCount: row.MessageCount,
		WorkspaceDir: row.WorkspaceDir, UpdateSubject: subject, UpdateSeq: proto.Int64(s.updateSeqOf(row))}, nil
}

// Close ends a session's use and keeps its durable history: a running
// turn is cancelled, and session/new with its id reopens it.
func (s *Server) Close(ctx context.Context, req *sessionv1.CloseRequest) (*sessionv1.CloseResponse, error) {
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	if row.State == stateKilled {
		return nil, errSessionEnded(row.ID, row.State)
	}
	ls, release := s.hold(ctx, row)
	defer release()
	if err := s.endSession(ctx, ls, stateClosed); err != nil {
		return nil, err
	}
	return &sessionv1.CloseResponse{SessionId: row.ID, Closed: true}, nil
}

// Kill cancels a running turn, then tombstones the session: its history
// stays readable, it never runs (and is never resumed) again. The turn is
// cancelled even when the tombstone cannot be written; then the RPC fails
// and the session stays usable.
func (s *Server) Kill(ctx context.Context, req *sessionv1.KillRequest) (*sessionv1.KillResponse, error) {
	ls, release, err := s.target(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.endSession(ctx, ls, stateKilled); err != nil {
		return nil, err
	}
	return &sessionv1.KillResponse{SessionId: ls.id, Killed: true}, nil
}

// target finds the session a kill or delete acts on: the in-memory one
// when there is one, so that its running turn is reached and cancelled
// even when the database is not, else the stored row.
func (s *Server) target(ctx context.Context, p *commonv1.Principal, id string) (*liveSession, func(), error) {
	if err := requirePrincipal(p); err != nil {
		return nil, nil, err
	}
	if ls := s.holdExisting(id, 0); ls != nil {
		if !p.GetOperator() && ls.owner != p.GetPrincipalId() {
			s.release(ls)
			return nil, nil, errSessionNotOwned(id)
		}
		return ls, func() { s.release(ls) }, nil
	}
	row, err := s.owned(ctx, p, id)
	if err != nil {
		return nil, nil, err
	}
	ls, release := s.hold(ctx, row)
	return ls, release, nil
}

// endSession closes or kills ls: it cancels the running turn first, then
// writes the new state. No turn is admitted in between. When the write
// fails the error is returned and the session stays as it was, minus the
// cancelled turn.
func (s *Server) endSession(ctx context.Context, ls *liveSession, state string) error {
	if err := ls.settle(ctx); err != nil {
		return err
	}
	if ls.deleting {
		ls.mu.Unlock()
		return errSessionNotFound(ls.id)
	}
	ls.ending, ls.endingDone = state, make(chan struct{})
	t := ls.turn
	ls.mu.Unlock()
	if t != nil {
		s.stopTurn(ctx, t, fmt.Errorf("%w: %s", ErrSessionEnded, state))
	}

	ls.mu.Lock()
	defer func() {
		ls.ending = ""
		close(ls.endingDone)
		ls.mu.Unlock()
	}()
	from := []string{stateIdle, stateRunning, stateClosed}
	if state == stateClosed {
		from = []string{stateIdle, stateRunning}
	}
	changed, err := s.store.setState(ctx, ls.id, state, from...)
	if err != nil {
		s.log.Warn("session not ended", zap.String("session_id", ls.id), zap.String("state", state), zap.Bool("turn_cancelled", t != nil), zap.Error(err))
		return err
	}
	if !changed && state == stateClosed {
		// Killed since the caller read it (a kill this close waited
		// for, say): a close does not undo that, nor says it closed.
		if row, err := s.store.session(ctx, ls.id); err == nil && row.State == stateKilled {
			return errSessionEnded(ls.id, stateKilled)
		}
	}
	s.log.Info("session ended", zap.String("session_id", ls.id), zap.String("state", state))
	return nil
}

// Delete cancels a running turn, then removes the session's durable rows
// (its transcript, retained context and checkpoints, turns, tool calls,
// approvals), then forgets the in-memory session and removes its
// workspace. If the rows cannot be removed the RPC fails and the session
// stays as it was, minus the cancelled turn; its rows are intact.
func (s *Server) Delete(ctx context.Context, req *sessionv1.DeleteRequest) (*sessionv1.DeleteResponse, error) {
	ls, release, err := s.target(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	defer release()
	if err := ls.settle(ctx); err != nil {
		return nil, err
	}
	if ls.deleting {
		ls.mu.Unlock()
		return nil, errSessionNotFound(ls.id)
	}
	ls.deleting = true
	t := ls.turn
	ls.mu.Unlock()
	unwound := true
	if t != nil {
		unwound = s.stopTurn(ctx, t, fmt.Errorf("%w: deleted", ErrSessionEnded))
	}
	if _, err := s.store.deleteSession(ctx, ls.id, ls.incarnation); err != nil {
		ls.mu.Lock()
		ls.deleting = false
		ls.mu.Unlock()
		s.log.Warn("session not deleted", zap.String("session_id", ls.id), zap.Bool("turn_cancelled", t != nil), zap.Error(err))
		return nil, err
	}
	ls.mu.Lock()
	s.dropUnended(ls)
	ls.mu.Unlock()
	s.forget(ls)
	if err := s.removeWorkspace(ls.id); err != nil {
		s.log.Warn("remove session workspace", zap.String("session_id", ls.id), zap.Error(err))
	}
	if !unwound {
		s.endAbandoned(t)
	}
	// The id is free now and may next name another principal's session.
	s.publishDeleted(ls)
	s.log.Info("session deleted", zap.String("session_id", ls.id))
	return &sessionv1.DeleteResponse{SessionId: ls.id, Deleted: true}, nil
}

// Attach checks that the principal may follow the session and names the
// NATS subject of its updates.
func (s *Server) Attach(ctx context.Context, req *sessionv1.AttachRequest) (*sessionv1.AttachResponse, error) {
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	subject, err := updateSubject(row.ID, row.Incarnation)
	if err != nil {
		return nil, err
	}
	return &sessionv1.AttachResponse{SessionId: row.ID, Subject: subject, UpdateSeq: proto.Int64(s.updateSeqOf(row))}, nil
}

// agentAt resolves alias again once the config revision rev, the one the
// caller's connection last wrote, has been read: the client was told its
// write of the agent was done, and the announcement of it may not have
// reached this process yet. The wait is bounded (configclient.AtLeast)
// and taken only by a caller that wrote, for an alias not known: an
// alias no one set is refused from memory when no revision is asked, or
// once the one asked is read.
func (s *Server) agentAt(ctx context.Context, alias string, rev int64) error {
	if err := s.readUpTo(ctx, rev); err != nil {
		return err
	}
	_, err := s.cfg.Agents.Agent(ctx, alias)
	return err
}

// readUpTo returns once the agent source has read config revision rev
// (configclient.AtLeast), a revision the caller's connection wrote. Its
// error wraps configclient.ErrConfigNoAnswer (the config service did not
// answer within the bound) or is the caller's own end; a revision not
// served (another history's) is logged, and what was read decides. A
// source that follows no revisions (static agents) has nothing to read.
func (s *Server) readUpTo(ctx context.Context, rev int64) error {
	f, ok := s.cfg.Agents.(interface {
		AtLeast(ctx context.Context, rev int64) error
	})
	if !ok {
		return nil
	}
	err := f.AtLeast(ctx, rev)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, configclient.ErrConfigNoAnswer):
		return fmt.Errorf("config service: %w", err)
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	s.log.Warn("config revision asked by the caller not read", zap.Int64("revision", rev), zap.Error(err))
	return nil
}

// readLatest returns once the agent source has read the config
// revision the config service serves now (configclient.Latest): for a
// turn whose caller knows no revision (a durable pane's text, a
// channel's message) after a write another client made. Its errors are
// readUpTo's.
func (s *Server) readLatest(ctx context.Context) error {
	f, ok := s.cfg.Agents.(interface {
		Latest(ctx context.Context) error
	})
	if !ok {
		return nil
	}
	err := f.Latest(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, configclient.ErrConfigNoAnswer):
		return fmt.Errorf("config service: %w", err)
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	s.log.Warn("latest config revision not read", zap.Error(err))
	return nil
}

// configError is the caller's answer when the config service could not
// be read for its request: with its reason, the client is told which
// service did not answer, not "session unavailable".
func configError(err error) error {
	if errors.Is(err, configclient.ErrConfigNoAnswer) {
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, configclient.ErrConfigNoAnswer.Error())
	}
	return status.Error(codes.Unavailable, "config service unavailable")
}
