package session

import (
	"context"
	"errors"

	"github.com/clawmesh/clawmesh/internal/hostclock"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// State reports idle, running (with the turn id), closed or killed.
func (s *Server) State(ctx context.Context, req *sessionv1.StateRequest) (*sessionv1.StateResponse, error) {
	// Read before anything the answer holds (see read_at in the proto).
	at := hostclock.Early()
	row, err := s.ownedBy(ctx, req.GetPrincipal(), req.GetSessionId(), s.store.sessionKept)
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.StateResponse{SessionId: row.ID, State: stateEnum[s.stateOf(row)], ReadAt: at}
	if ls := s.liveOf(row); ls != nil {
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
	if ls := s.liveOf(row); ls != nil && ls.running() != nil {
		return stateRunning
	}
	return stateIdle
}

// pageBytes bounds the content of one page of Messages, as JSON. A message
// may be megabytes (a prompt up to the 8 MiB frame, the provider's
// answer), and a page of 1000 of them would pass the 16 MiB a message
// between the processes may be and the frame a client reads: the page
// ends before the message that takes it past this, holding at least one
// (cut at maxReadMessage), and the client pages on with before_index. It
// is measured as JSON, not as bytes: a '<' or a control character is six
// bytes in the page a client reads, and a page of three prompts of '<'
// bounded by their bytes was 24 MB.
const pageBytes = 4 << 20

// Messages pages through the visible transcript, oldest first: the last
// limit rows (default 50, at most 1000) before before_index when given,
// fewer when their content passes pageBytes, and the transcript's total
// length. Indexes never change.
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

// Status counts the sessions that are open (idle or running) and lists
// those the principal owns (all of them for the operator).
func (s *Server) Status(ctx context.Context, req *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	// Read before the sessions are (see read_at in the proto).
	at := hostclock.Early()
	// The open sessions as last read while no write has ended since;
	// else a read shared with the Status calls that arrived with this
	// one, never one that started before this call did.
	open, ok := s.store.openSessionsNow(ctx)
	if !ok {
		var err error
		if open, err = s.openReads.Do(ctx, struct{}{}, s.store.openSessionsKeeping); err != nil {
			return nil, err
		}
	}
	resp := &sessionv1.StatusResponse{ActiveSessions: int64(len(open)), SessionIds: []string{}, ReadAt: at}
	for _, o := range open {
		if req.GetPrincipal().GetOperator() || o.Owner == req.GetPrincipal().GetPrincipalId() {
			resp.SessionIds = append(resp.SessionIds, o.ID)
		}
	}
	return resp, nil
}
