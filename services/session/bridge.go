package session

// The RPCs the durable bridge needs (seed 004): it shows every session to
// a phone, raises every pending approval there, and starts and stops
// turns for the operator. Everything here reads what rpc.go, turn.go and
// approvals.go keep; nothing here changes how a turn runs.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Paging bounds of the bridge's RPCs.
const (
	// MaxTranscriptLimit bounds one Transcript read: the durable wire
	// shows at most the newest 2000 items of a pane.
	MaxTranscriptLimit = 2000
	// maxPageToken bounds a page token (the durable wire's cursor limit).
	maxPageToken = 512
)

// ListSessionViews pages through the principal's sessions (every session
// for the operator), most recently active first: open ones, or every one
// with include_closed.
func (s *Server) ListSessionViews(ctx context.Context, req *sessionv1.ListSessionViewsRequest) (*sessionv1.ListSessionViewsResponse, error) {
	p := req.GetPrincipal()
	if err := requirePrincipal(p); err != nil {
		return nil, err
	}
	limit, err := pageLimit("page_size", req.GetPageSize())
	if err != nil {
		return nil, err
	}
	after, err := parsePageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	owner := p.GetPrincipalId()
	if p.GetOperator() {
		owner = ""
	}
	rows, err := s.store.sessionPage(ctx, owner, req.GetIncludeClosed(), after, limit+1)
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.ListSessionViewsResponse{}
	if int64(len(rows)) > limit {
		rows = rows[:limit]
		last := rows[len(rows)-1]
		resp.NextPageToken = pageToken{updated: last.UpdatedAt, id: last.ID}.String()
	}
	for _, r := range rows {
		v, err := s.view(ctx, r)
		if err != nil {
			return nil, err
		}
		resp.Views = append(resp.Views, v)
	}
	return resp, nil
}

// GetSessionView returns one session's view.
func (s *Server) GetSessionView(ctx context.Context, req *sessionv1.GetSessionViewRequest) (*sessionv1.GetSessionViewResponse, error) {
	// The sequence is read before the row, as in view: see there.
	seq, incarnation := s.liveSeq(req.GetSessionId())
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	v, err := s.viewAt(ctx, row, seqOf(row, seq, incarnation))
	if err != nil {
		return nil, err
	}
	return &sessionv1.GetSessionViewResponse{View: v}, nil
}

// liveSeq is the last update sequence number a live session used, and
// the incarnation of the live session; 0, 0 when the id has no live half.
// A live half that has numbered nothing answers the last number published
// as stored when it was made (seqLast): its seq is the stored bound, which
// after a crash is a reservation past what was published.
func (s *Server) liveSeq(id string) (seq, incarnation int64) {
	ls := s.lookupLive(id)
	if ls == nil {
		return 0, 0
	}
	ls.pubMu.Lock()
	defer ls.pubMu.Unlock()
	if ls.seq == ls.seqFrom && ls.seqLost == 0 {
		return ls.seqLast, ls.incarnation
	}
	return ls.seq, ls.incarnation
}

// seqOf is the update_seq of row's view given what liveSeq read: the live
// half's when it is row's incarnation. A session without a live half of
// its own (none, or one of a deleted session under the id) has published
// nothing since the last number its row stores as published (LastSeq:
// the stored bound only where that is not known, a turn cut by a crash).
// The bound itself answered before: after a crash it is a block past the
// last update, and the durable bridge took every pane for one that had
// lost updates and rebuilt it, resetting each phone's read of it.
func seqOf(row sessionRow, seq, incarnation int64) int64 {
	if incarnation != row.Incarnation {
		return row.LastSeq
	}
	return seq
}

// view builds a session's view from its row.
func (s *Server) view(ctx context.Context, row sessionRow) (*sessionv1.SessionView, error) {
	seq, incarnation := s.liveSeq(row.ID)
	return s.viewAt(ctx, row, seqOf(row, seq, incarnation))
}

// viewAt builds the view with update_seq seq. The sequence must have been
// read before everything else the view shows: a reader that applies every
// update after it then misses nothing (it may see some twice, which the
// bridge's handling tolerates). A live half of another incarnation (a
// session deleted under the id) has no turn or approval of row's.
func (s *Server) viewAt(ctx context.Context, row sessionRow, seq int64) (*sessionv1.SessionView, error) {
	v := &sessionv1.SessionView{Session: toProto(row, s.stateOf(row)), UpdateSeq: seq, Incarnation: row.Incarnation}
	ls := s.liveOf(row)
	if ls == nil {
		return v, nil
	}
	if t := ls.running(); t != nil {
		v.TurnId = t.id
		started, err := s.store.turnStarted(ctx, t.id)
		if err != nil {
			return nil, err
		}
		v.TurnStartedAt = timestamppb.New(started)
		v.Session.State = sessionv1.SessionState_SESSION_STATE_RUNNING
	}
	pending, err := s.pendingApprovals(ctx, ls)
	if err != nil {
		return nil, err
	}
	v.Approvals = pending
	return v, nil
}

// pendingApprovals lists the approvals of ls nobody decided yet, oldest
// first, with their arguments and expiry.
func (s *Server) pendingApprovals(ctx context.Context, ls *liveSession) ([]*sessionv1.ApprovalView, error) {
	ls.mu.Lock()
	var open []approval
	for _, a := range ls.approvals {
		select {
		case <-a.decided:
			continue
		default:
		}
		open = append(open, approval{RequestID: a.RequestID, ToolCallID: a.ToolCallID, ToolName: a.ToolName,
			Summary: a.Summary, TurnID: a.TurnID, Timeout: a.Timeout})
	}
	ls.mu.Unlock()
	if len(open) == 0 {
		return nil, nil
	}
	reqIDs := make([]string, len(open))
	for i, a := range open {
		reqIDs[i] = a.RequestID
	}
	stored, err := s.store.approvalRecords(ctx, reqIDs)
	if err != nil {
		return nil, err
	}
	out := make([]*sessionv1.ApprovalView, 0, len(open))
	for _, a := range open {
		v := &sessionv1.ApprovalView{
			RequestId: a.RequestID, SessionId: ls.id, TurnId: a.TurnID, ToolCallId: a.ToolCallID, ToolName: a.ToolName,
			Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING,
		}
		created := time.Now()
		if rec, ok := stored[a.RequestID]; ok {
			created = rec.CreatedAt
			v.ArgumentsJson = rec.Arguments
		} else {
			// The request's row could not be written (logged where it
			// happened): show what memory has. Its expiry counted from now
			// is later than the real one, never earlier.
			v.ArgumentsJson = strconv.Quote(a.Summary)
		}
		// The row is written before the timer starts, so this is at or
		// just before the moment the timeout denies the call.
		v.CreatedAt = timestamppb.New(created)
		v.ExpiresAt = timestamppb.New(created.Add(a.Timeout))
		out = append(out, v)
	}
	slices.SortFunc(out, func(x, y *sessionv1.ApprovalView) int {
		if c := x.GetCreatedAt().AsTime().Compare(y.GetCreatedAt().AsTime()); c != 0 {
			return c
		}
		return strings.Compare(x.GetRequestId(), y.GetRequestId())
	})
	return out, nil
}

// Transcript reads the visible transcript: the first limit rows after
// after_index, or the last limit rows; oldest first either way, and fewer
// when their content passes pageBytes (Messages).
func (s *Server) Transcript(ctx context.Context, req *sessionv1.TranscriptRequest) (*sessionv1.TranscriptResponse, error) {
	if _, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId()); err != nil {
		return nil, err
	}
	limit := req.GetLimit()
	switch {
	case limit == 0:
		limit = DefaultPageLimit
	case limit < 0 || limit > MaxTranscriptLimit:
		return nil, errInvalid(fmt.Sprintf("`limit` must be between 1 and %d", MaxTranscriptLimit))
	}
	after := int64(-2)
	if req.AfterIndex != nil {
		if req.GetAfterIndex() < -1 {
			return nil, errInvalid("`after_index` must be -1 or more")
		}
		after = req.GetAfterIndex()
	}
	rows, total, err := s.store.transcript(ctx, req.GetSessionId(), after, limit)
	if errors.Is(err, errNoRow) {
		return nil, errSessionNotFound(req.GetSessionId())
	}
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.TranscriptResponse{SessionId: req.GetSessionId(), Total: total, Messages: rows}
	return resp, nil
}

// approvalWaits, when set (tests only), runs in GetApproval once it
// waits for the write of a decision taken in memory.
var approvalWaits atomic.Pointer[func(requestID string)]

// GetApproval reads one approval request of the session: pending (with
// its expiry), decided (with the decision and the surface that won),
// timed out or cancelled. A decision taken in memory and still being
// written is said once the write ends, as Approve says it: the write may
// fail, or find the row settled by another writer, and then the ask ends
// cancelled. Said at once, it was a decision of what then ended
// cancelled. A caller whose context ends first is told what is known:
// pending, as the row still reads.
func (s *Server) GetApproval(ctx context.Context, req *sessionv1.GetApprovalRequest) (*sessionv1.GetApprovalResponse, error) {
	id, reqID := req.GetSessionId(), req.GetRequestId()
	if err := checkApprovalIDs(id, reqID); err != nil {
		return nil, err
	}
	if _, err := s.owned(ctx, req.GetPrincipal(), id); err != nil {
		return nil, err
	}
	v, writing, err := s.readApproval(ctx, id, reqID)
	if err != nil {
		return nil, err
	}
	if writing != nil {
		// The turn ends the write within its unwind bound (see ask);
		// the caller's context bounds this wait only.
		if hook := approvalWaits.Load(); hook != nil {
			(*hook)(reqID)
		}
		select {
		case <-writing:
			// The ask has left ls.approvals now, in the same step that
			// closed writing: this read finds it settled.
			if v, _, err = s.readApproval(ctx, id, reqID); err != nil {
				return nil, err
			}
		case <-ctx.Done():
		}
	}
	return &sessionv1.GetApprovalResponse{Approval: v}, nil
}

// readApproval reads approval reqID of session id. writing is set when a
// decision was taken in memory and is still being written (it is closed
// once the write ended, see approval.acted); v then says pending.
func (s *Server) readApproval(ctx context.Context, id, reqID string) (v *sessionv1.ApprovalView, writing <-chan struct{}, err error) {
	// Memory first: a decision is taken there before it is stored, and
	// the turn keeps the one it acted on (turn.asked) while the row may
	// still read as a failed write left it, pending or another writer's,
	// until the turn's end marks it cancelled. Approve answers from the
	// same place.
	var mem *approval
	var d decision
	decided := false
	if ls := s.lookupLive(id); ls != nil {
		ls.mu.Lock()
		if a := ls.approvals[reqID]; a != nil {
			cp := *a
			mem = &cp
			select {
			case <-a.decided:
				writing = a.acted
			default:
			}
		} else if ls.turn != nil && ls.turn.asked[reqID] != nil {
			a := ls.turn.asked[reqID]
			cp := *a
			mem = &cp
			decided, d = true, a.stands
		}
		ls.mu.Unlock()
	}
	recs, err := s.store.approvalRecords(ctx, []string{reqID})
	if err != nil {
		return nil, nil, err
	}
	rec, stored := recs[reqID]
	if stored && rec.SessionID != id {
		stored = false
	}
	if mem == nil && !stored {
		return nil, nil, errUnknownApproval(reqID)
	}
	v = &sessionv1.ApprovalView{RequestId: reqID, SessionId: id}
	if stored {
		v.TurnId, v.ToolCallId, v.ToolName, v.ArgumentsJson = rec.TurnID, rec.ToolCallID, rec.ToolName, rec.Arguments
		v.CreatedAt = timestamppb.New(rec.CreatedAt)
		if rec.DecidedAt != nil {
			v.DecidedAt = timestamppb.New(*rec.DecidedAt)
		}
	}
	switch {
	case mem != nil && decided:
		v.TurnId, v.ToolCallId, v.ToolName = mem.TurnID, mem.ToolCallID, mem.ToolName
		v.Status, v.Decision, v.Surface = viewStanding(d, "decided")
	case mem != nil:
		// Nobody decided, or the decision is being written: until
		// that write ends it is not known to stand.
		v.TurnId, v.ToolCallId, v.ToolName = mem.TurnID, mem.ToolCallID, mem.ToolName
		v.Status = sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING
		v.DecidedAt = nil
		created := time.Now()
		if stored {
			created = rec.CreatedAt
		}
		v.ExpiresAt = timestamppb.New(created.Add(mem.Timeout))
	default:
		v.Status, v.Decision, v.Surface = viewStanding(decision{Decision: rec.Decision, Surface: rec.Surface}, rec.Status)
	}
	return v, writing, nil
}

// viewStanding is the standing decision d, as stored with status (or
// taken in memory: "decided"), as Approve says it (see standing): a
// cancelled row keeps the decision whose write it undid, which does not
// stand and is not reported.
func viewStanding(d decision, status string) (sessionv1.ApprovalStatus, sessionv1.Decision, sessionv1.Surface) {
	var resp sessionv1.ApproveResponse
	standing(&resp, d, status)
	return resp.Status, resp.Decision, resp.Surface
}

// decisionStatus maps a stored status and decision word to the status
// enum.
func decisionStatus(word, status string) sessionv1.ApprovalStatus {
	switch {
	case status == "cancelled" || word == decisionCancelled:
		return sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED
	case word == decisionTimeout:
		return sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT
	case status == "pending":
		return sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING
	}
	return sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED
}

func decisionEnum(word string) sessionv1.Decision {
	for e, w := range decisionWords {
		if w == word {
			return e
		}
	}
	return sessionv1.Decision_DECISION_UNSPECIFIED
}

func surfaceEnum(word string) sessionv1.Surface {
	for e, w := range surfaceWords {
		if w == word {
			return e
		}
	}
	return sessionv1.Surface_SURFACE_UNSPECIFIED
}

// StartTurn admits a turn as Prompt does and answers with its id without
// waiting for it: the turn belongs to no caller and no connection, so it
// runs to its end unless it is cancelled (Cancel, CancelTurn, the session
// ending, shutdown).
func (s *Server) StartTurn(ctx context.Context, req *sessionv1.StartTurnRequest) (*sessionv1.StartTurnResponse, error) {
	if strings.TrimSpace(req.GetPrompt()) == "" {
		if err := requirePrincipal(req.GetPrincipal()); err != nil {
			return nil, err
		}
		return nil, errInvalid("`prompt` is required")
	}
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	if n := req.GetIncarnation(); n != 0 && n != row.Incarnation {
		return nil, errSessionNotFound(row.ID)
	}
	// The bridge knows no config revision: its text may follow a config
	// write made a moment ago on the socket, acknowledged before the
	// text was sent, and the turn read the agent as of the revision
	// followed over the bus. The revision the config service serves now
	// is read first (one read shared by the turns that arrive together).
	if err := s.readLatest(ctx); err != nil {
		return nil, configError(err)
	}
	if err := s.mayUseAgent(ctx, req.GetPrincipal(), row.AgentAlias); err != nil {
		return nil, err
	}
	ls, release := s.hold(ctx, row)
	defer release() // a running turn keeps the entry from eviction itself
	// No idempotency key: the bridge's requests are deduplicated by
	// their request ids (durablebridge), so admit never replays here.
	t, _, err := s.admit(ctx, ls, &sessionv1.PromptRequest{Principal: req.GetPrincipal(), SessionId: row.ID, Prompt: req.GetPrompt()}, req.GetPrompt())
	if err != nil {
		return nil, err
	}
	return &sessionv1.StartTurnResponse{SessionId: row.ID, TurnId: t.id}, nil
}

// CancelTurn cancels the running turn when it is the one named, and waits
// (bounded) for it to end; another turn is left running and named in the
// answer.
func (s *Server) CancelTurn(ctx context.Context, req *sessionv1.CancelTurnRequest) (*sessionv1.CancelTurnResponse, error) {
	if _, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId()); err != nil {
		return nil, err
	}
	if req.GetTurnId() == "" {
		return nil, errInvalid("`turn_id` is required")
	}
	resp := &sessionv1.CancelTurnResponse{SessionId: req.GetSessionId()}
	ls := s.lookupLive(req.GetSessionId())
	if ls == nil {
		return resp, nil
	}
	t := ls.running()
	switch {
	case t == nil:
	case t.id != req.GetTurnId():
		resp.RunningTurnId = t.id
	default:
		s.stopTurn(ctx, t, ErrCancelRequested)
		resp.Cancelled = true
	}
	return resp, nil
}

// pageToken is a position in the most-recently-active-first order.
type pageToken struct {
	updated time.Time
	id      string
}

// String encodes the token as "v1.<unix microseconds>.<session id>".
func (p pageToken) String() string {
	return "v1." + strconv.FormatInt(p.updated.UnixMicro(), 10) + "." + p.id
}

func parsePageToken(s string) (*pageToken, error) {
	if s == "" {
		return nil, nil
	}
	bad := errInvalid("`page_token` is not one this service returned")
	if len(s) > maxPageToken {
		return nil, bad
	}
	version, rest, ok := strings.Cut(s, ".")
	if !ok || version != "v1" {
		return nil, bad
	}
	micros, id, ok := strings.Cut(rest, ".")
	n, err := strconv.ParseInt(micros, 10, 64)
	if !ok || err != nil || id == "" || len(id) > 128 {
		return nil, bad
	}
	return &pageToken{updated: time.UnixMicro(n), id: id}, nil
}

// The store's part of these RPCs.

// sessionPage reads up to limit sessions after a position, most recently
// active first (session id breaking ties).
func (st *store) sessionPage(ctx context.Context, owner string, includeClosed bool, after *pageToken, limit int64) ([]sessionRow, error) {
	states := []string{stateIdle, stateRunning}
	if includeClosed {
		states = append(states, stateClosed, stateKilled)
	}
	var afterTime *time.Time
	afterID := ""
	if after != nil {
		afterTime, afterID = &after.updated, after.id
	}
	// timestamptz holds microseconds, the token's precision.
	rows, err := st.db.Query(ctx, "SELECT "+sessionColumns+` FROM sessions
		WHERE ($1 = '' OR owner = $1) AND state = ANY($2)
		  AND ($3::timestamptz IS NULL OR updated_at < $3 OR (updated_at = $3 AND session_id > $4))
		ORDER BY updated_at DESC, session_id LIMIT $5`,
		owner, states, afterTime, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer rows.Close()
	var out []sessionRow
	for rows.Next() {
		r, err := scanSession(rows)
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	return out, nil
}

func (st *store) turnStarted(ctx context.Context, turnID string) (time.Time, error) {
	var at time.Time
	err := st.db.QueryRow(ctx, "SELECT started_at FROM turns WHERE turn_id = $1", turnID).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		// Admitted turns are stored before they run; a missing row means
		// it was deleted with its session meanwhile.
		return time.Now(), nil
	}
	if err != nil {
		return at, fmt.Errorf("read turn: %w", err)
	}
	return at, nil
}

// approvalRecord is an approval's row with its call's arguments.
type approvalRecord struct {
	SessionID, TurnID, ToolCallID, ToolName string
	Status, Decision, Surface               string
	Arguments                               string
	CreatedAt                               time.Time
	DecidedAt                               *time.Time
}

// approvalRecords reads the approvals named, by request id.
func (st *store) approvalRecords(ctx context.Context, requestIDs []string) (map[string]approvalRecord, error) {
	rows, err := st.db.Query(ctx, `SELECT a.request_id, a.session_id, a.turn_id, a.tool_call_id, a.tool_name, a.status,
			a.decision, a.surface, COALESCE(c.raw_input::text, 'null'), a.created_at, a.decided_at
		FROM approvals a LEFT JOIN tool_calls c ON c.session_id = a.session_id AND c.tool_call_id = a.tool_call_id
		WHERE a.request_id = ANY($1)`, requestIDs)
	if err != nil {
		return nil, fmt.Errorf("read approvals: %w", err)
	}
	defer rows.Close()
	out := make(map[string]approvalRecord, len(requestIDs))
	for rows.Next() {
		var id string
		var r approvalRecord
		if err := rows.Scan(&id, &r.SessionID, &r.TurnID, &r.ToolCallID, &r.ToolName, &r.Status, &r.Decision, &r.Surface,
			&r.Arguments, &r.CreatedAt, &r.DecidedAt); err != nil {
			return nil, fmt.Errorf("read approvals: %w", err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read approvals: %w", err)
	}
	return out, nil
}

// transcript reads rows after index after (or the last limit rows when
// after is -2), oldest first, and the transcript's length.
func (st *store) transcript(ctx context.Context, id string, after, limit int64) ([]*sessionv1.TranscriptMessage, int64, error) {
	const cols = "idx, role, content, created_at, turn_id"
	q := pageSQL(cols, "idx > $2", false)
	if after == -2 {
		q = pageSQL(cols, "$2 = -2", true)
	}
	rows, err := st.db.Query(ctx, countedPageSQL(q, "p.idx, p.role, "+readContentSQL+", p.created_at, p.turn_id"), id, after, limit, pageBytes)
	if err != nil {
		return nil, 0, fmt.Errorf("read transcript: %w", err)
	}
	var total int64
	found := false
	msgs := []*sessionv1.TranscriptMessage{}
	for rows.Next() {
		var idx, size *int64
		var role, content, turn *string
		var head []byte
		var at *time.Time
		if err := rows.Scan(&total, &idx, &role, &content, &head, &size, &at, &turn); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("read transcript: %w", err)
		}
		found = true
		if idx != nil {
			msgs = append(msgs, &sessionv1.TranscriptMessage{Index: *idx, Role: *role, Content: readContent(content, head, *size),
				CreatedAt: timestamppb.New(*at), TurnId: *turn})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read transcript: %w", err)
	}
	if !found {
		return nil, 0, errNoRow
	}
	return msgs, total, nil
}
