package session

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/ids"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

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
	if key := req.GetIdempotencyKey(); key != "" && !ids.Token(key) {
		if err := requirePrincipal(req.GetPrincipal()); err != nil {
			return nil, err
		}
		return nil, errInvalid("`idempotency_key` " + ids.ErrFormat.Error())
	}
	row, err := s.owned(ctx, req.GetPrincipal(), id)
	if err != nil {
		return nil, err
	}
	if n := req.GetIncarnation(); n != 0 && n != row.Incarnation {
		return nil, errSessionNotFound(id)
	}
	// Attachments must be files stored in this session (files.go).
	if prompt, err = s.withAttachments(ctx, row.ID, row.WorkspaceDir, prompt, req.GetAttachments()); err != nil {
		return nil, err
	}
	// The caller's own config write, acknowledged before this prompt,
	// is read before the turn resolves its agent: followed over the bus
	// alone, a turn right after a config/set that changed the agent ran
	// with the agent as it was.
	if rev := req.GetConfigRevision(); rev > 0 {
		if err := s.readUpTo(ctx, rev); err != nil {
			return nil, configError(err)
		}
	}
	// A caller that knows no revision (a channel) asks for the one
	// served as its prompt arrived.
	if req.GetConfigLatest() {
		if err := s.readLatest(ctx); err != nil {
			return nil, configError(err)
		}
	}
	// Checked on every turn: a grant revoked since session/new stops the
	// next turn.
	if err := s.mayUseAgent(ctx, req.GetPrincipal(), row.AgentAlias); err != nil {
		return nil, err
	}
	ls, release := s.hold(ctx, row)
	defer release()
	t, replay, err := s.admit(ctx, ls, req, prompt)
	if err != nil {
		return nil, err
	}
	if replay != nil {
		return &sessionv1.PromptResponse{SessionId: id, TurnId: replay.ID, Outcome: outcomeEnum[replay.Outcome],
			StopReason: replay.StopReason, Content: replay.Content, Replayed: true}, nil
	}
	stop := context.AfterFunc(ctx, func() { t.cancel(ErrCallerGone) })
	defer stop()
	<-t.done
	return &sessionv1.PromptResponse{
		SessionId: id, TurnId: t.id, Outcome: outcomeEnum[t.result.Outcome], StopReason: t.result.StopReason, Content: t.result.Content,
	}, nil
}

// admitTimeout bounds admit's database work, done holding ls.mu. A
// prompt's call has no deadline (a turn runs as long as it runs), and a
// stalled database (a lock on the session's row, a hung server) kept the
// lock for as long as it lasted: every call that reads a session's turn
// (ConnectionClosed for any connection, Cancel, State, Close) waited
// past its own deadline. A variable so that a test may shorten it.
var admitTimeout = 10 * time.Second

// admit starts a turn on ls unless one is running or the session ended.
// A prompt whose idempotency key a turn of the session completed or
// failed with starts none: that turn is returned (replay) instead.
func (s *Server) admit(ctx context.Context, ls *liveSession, req *sessionv1.PromptRequest, prompt string) (*turn, *keyedTurn, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	if ls.deleting {
		return nil, nil, errSessionNotFound(ls.id)
	}
	if ls.turn != nil {
		return nil, nil, errSessionBusy(ls.id)
	}
	if ls.ending != "" {
		return nil, nil, errSessionEnded(ls.id, ls.ending)
	}
	// Read again under the lock: the state may have changed since.
	row, err := s.store.session(ctx, ls.id)
	if errors.Is(err, errNoRow) {
		return nil, nil, errSessionNotFound(ls.id)
	}
	if err != nil {
		return nil, nil, admitError(err)
	}
	if row.State == stateClosed || row.State == stateKilled {
		return nil, nil, errSessionEnded(ls.id, row.State)
	}
	// The session's ends not written are written first: the keyed turn
	// may be one of them, and is then answered as it ended.
	if err := s.endUnended(ctx, ls); err != nil {
		return nil, nil, admitError(err)
	}
	key := req.GetIdempotencyKey()
	resume, replay, err := s.keyed(ctx, ls, key)
	if err != nil || replay != nil {
		return nil, replay, err
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errShuttingDown
	}
	s.wg.Add(1)
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.wg.Done()
		}
	}()
	if resume {
		s.log.Info("turn resumed: its message was delivered again", zap.String("session_id", ls.id), zap.String("idempotency_key", key))
	}

	t := &turn{
		id: ids.New("turn_"), ls: ls, alias: row.AgentAlias, surface: row.Surface, principal: req.GetPrincipal(),
		connID: req.GetConnectionId(), done: make(chan struct{}),
	}
	if req.ClientTurnGeneration != nil {
		g := req.GetClientTurnGeneration()
		t.gen = &g
	}
	// The turn row, the prompt's transcript row, its first checkpoint
	// event and, when the session is short of them, the update numbers
	// its first updates will use are one transaction.
	reserve := ls.seqToReserve()
	next, err := s.store.beginTurn(ctx, turnStart{
		SessionID: ls.id, TurnID: t.id, ConnID: t.connID, Surface: t.surface, Prompt: prompt, Generation: t.gen,
		ReserveSeq: reserve, Key: key, Resume: resume,
	})
	if errors.Is(err, errClosedMeanwhile) {
		return nil, nil, errSessionEnded(ls.id, stateClosed)
	}
	if err != nil {
		return nil, nil, admitError(err)
	}
	ls.seqReservedUpTo(reserve)
	t.ctx, t.cancel = context.WithCancelCause(s.base)
	t.userSeq = next - 1
	t.log = s.cp.open(ls.id, t.id, t.surface, next)
	t.seqFrom = ls.lastSeq()
	ls.turn = t
	started = true
	s.publishTurnStarted(ls, t.connID)
	go s.runTurn(t)
	return t, nil, nil
}

// keyed decides what a prompt with idempotency key does, by the
// session's latest turn with it: nothing (none, resume false), resume a
// cut one (resume), or answer with a finished one (replay). A message
// delivered again (a channel's, after a rebind or a restart cut its
// turn) ran its turn a second time, and a tool with side effects acted
// twice for one message. A cut turn is resumed, not replayed: its
// sender has no answer yet. Interrupted by a restart of this service, a
// turn of a surface recovery does not restore (restoredSurfaces) is
// restored now: its calls that never got a result get one saying so,
// and its events come into the retained context, so the provider sees
// what ran. A call cut while it ran is thus reported cancelled, never
// run again blindly: it may have acted. ls.mu is held.
func (s *Server) keyed(ctx context.Context, ls *liveSession, key string) (resume bool, replay *keyedTurn, err error) {
	if key == "" {
		return false, nil, nil
	}
	prev, err := s.store.keyedTurn(ctx, ls.id, key)
	switch {
	case err != nil:
		return false, nil, admitError(err)
	case !prev.Found:
		return false, nil, nil
	case prev.State == turnDone && prev.Outcome != OutcomeCancelled:
		return false, &prev, nil
	case prev.State == turnInterrupted, prev.State == turnRunning:
		// Interrupted: left by a restart (above). Running, with no live
		// turn here (admit found ls.turn nil and wrote the session's
		// ends kept; one process owns every turn, and its start
		// recovered its predecessor's): this process ended the turn and
		// published its turn_complete, but the end's write failed (past
		// the unwind bound) and nothing wrote it since (endUnended, just
		// before, ends every such turn it holds: a guard). Refused busy
		// until the service's next start, its message's channel gave up
		// on it after five minutes. Both are ended as recovery ends a
		// turn, then resumed.
		it := interruptedTurn{SessionID: ls.id, TurnID: prev.ID, Surface: prev.Surface, Generation: prev.Generation}
		// nil: no turn_complete is published here (its session is idle).
		if _, err := s.store.recoverTurn(ctx, it, true, interruptedMarker, nil); err != nil {
			return false, nil, admitError(err)
		}
	}
	return true, nil, nil
}

// admitError says a database that did not answer in time so.
func admitError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.Unavailable, "the session store did not answer in time; the turn was not started")
	}
	return err
}

// Cancel cancels the running turn, if any, and waits (bounded) for it to
// end: afterwards the session reads idle. It says cancelled when the turn
// ended cancelled, or is still unwinding: a cancel that reaches a turn
// once its provider has answered, while it writes its end, changes
// nothing, and the turn completes.
func (s *Server) Cancel(ctx context.Context, req *sessionv1.CancelRequest) (*sessionv1.CancelResponse, error) {
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.CancelResponse{SessionId: req.GetSessionId()}
	if ls := s.liveOf(row); ls != nil {
		if t := ls.running(); t != nil {
			// t.result is set before t.done closes.
			resp.Cancelled = !s.stopTurn(ctx, t, ErrCancelRequested) || t.result.Outcome == OutcomeCancelled
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
