package session

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/internal/ids"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Bounds of TurnEvents.
const (
	// MaxTurnEventsTurns bounds the turns one TurnEvents call asks about.
	MaxTurnEventsTurns = 64
	// turnEventsBytes bounds the text of one turn's events and, but for
	// the first turn, of a response: a turn whose events pass it is left
	// out (its rows show it), a later turn past it waits for the next
	// call. A response is at most twice it, within a gRPC message.
	turnEventsBytes = 4 << 20
	// maxShownEvent bounds one event's text as TurnEvents reads it: a
	// pane shows at most 64 KiB of a turn's reply or thoughts and 32 KiB
	// of a tool item, and a checkpoint's coalesced text is far longer at
	// times.
	maxShownEvent = 256 << 10
)

// turnEventsWritten, when set (tests only), runs in TurnEvents once a
// running turn's pending events are written, before they are read: the
// window in which the checkpoint writer may write the turn's next batch.
var turnEventsWritten atomic.Pointer[func(sessionID string)]

// runningOf is row's running turn when it is one of asked, else nil.
func (s *Server) runningOf(row sessionRow, asked []string) *turn {
	if ls := s.liveOf(row); ls != nil {
		if t := ls.running(); t != nil && slices.Contains(asked, t.id) {
			return t
		}
	}
	return nil
}

// TurnEvents reads what turns showed as they ran, from their checkpoint
// events: thoughts (which the transcript does not hold), text, tool calls
// and results, in the order they were streamed, with each turn's end.
// A turn whose events were dropped by a context trim, or that ran before
// checkpoints, is left out: its prompt's event is gone with the rest.
func (s *Server) TurnEvents(ctx context.Context, req *sessionv1.TurnEventsRequest) (*sessionv1.TurnEventsResponse, error) {
	asked := req.GetTurnIds()
	if len(asked) == 0 || len(asked) > MaxTurnEventsTurns {
		return nil, errInvalid(fmt.Sprintf("`turn_ids` must name 1 to %d turns, not %d", MaxTurnEventsTurns, len(asked)))
	}
	for i, id := range asked {
		if !ids.Token(id) {
			return nil, errInvalid(fmt.Sprintf("`turn_ids[%d]` %v", i, ids.ErrFormat))
		}
	}
	row, err := s.owned(ctx, req.GetPrincipal(), req.GetSessionId())
	if err != nil {
		return nil, err
	}
	var shown map[string]*turnShown
	read := func(turns []string) (err error) {
		shown, err = s.store.turnEvents(ctx, req.GetSessionId(), turns)
		return err
	}
	// Taken before the store is read: an end written meanwhile is read
	// ended there, with its events, and not added again.
	unended := s.unendedOf(row, asked)
	var covered int64
	if t := s.runningOf(row, asked); t != nil {
		// A running turn's streamed text waits up to the checkpoint
		// interval to be written: written now, what its updates showed
		// before this call is all read. The turn goes on streaming
		// meanwhile: a view read after this answer also covers the
		// chunks streamed between the write and that read, which the
		// events lack (a rebuilt pane's thoughts missed them), so the
		// answer says up to which chunk update the events go, and its
		// events are read before the writer writes the next batch. Only
		// its own: the writer's lock holds every session's next batch
		// and every turn's end, and the finished turns asked with it
		// (up to 64, 4 MiB each) are read after it is released.
		covered, err = s.cp.writeThenRead(ctx, t.log, func() error {
			if hook := turnEventsWritten.Load(); hook != nil {
				(*hook)(req.GetSessionId())
			}
			return read([]string{t.id})
		})
		if others := slices.DeleteFunc(slices.Clone(asked), func(id string) bool { return id == t.id }); err == nil && len(others) > 0 {
			running := shown
			if err = read(others); err == nil {
				maps.Copy(shown, running)
			}
		}
	} else {
		err = read(asked)
	}
	if err != nil {
		return nil, err
	}
	if err := s.showUnended(ctx, req.GetSessionId(), shown, unended); err != nil {
		return nil, err
	}
	resp := &sessionv1.TurnEventsResponse{CoveredSeq: covered}
	total := 0
	for _, id := range asked {
		t, ok := shown[id]
		if !ok || t.bytes > turnEventsBytes {
			continue
		}
		if total > 0 && total+t.bytes > turnEventsBytes {
			break
		}
		total += t.bytes
		resp.Turns = append(resp.Turns, t.TurnShown)
	}
	given := make(map[string]bool, len(resp.Turns))
	for _, t := range resp.Turns {
		given[t.GetTurnId()] = true
	}
	var left []string
	for _, id := range asked {
		if !given[id] {
			left = append(left, id)
		}
	}
	if len(left) > 0 {
		if resp.Trims, err = s.store.turnTrims(ctx, req.GetSessionId(), left); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// turnTrims reads the context trims the session's turns named made at
// their start, in the order named; turns that trimmed nothing are left
// out. At most MaxTurnEventsTurns are named.
func (st *store) turnTrims(ctx context.Context, sessionID string, turnIDs []string) ([]*sessionv1.TurnTrim, error) {
	rows, err := st.db.Query(ctx, `SELECT turn_id, trimmed_messages, trimmed_at FROM turns
		WHERE session_id = $1 AND turn_id = ANY($2) AND trimmed_messages > 0`, sessionID, turnIDs)
	if err != nil {
		return nil, fmt.Errorf("read turn trims: %w", err)
	}
	defer rows.Close()
	byID := map[string]*sessionv1.TurnTrim{}
	for rows.Next() {
		var tr sessionv1.TurnTrim
		var at *time.Time
		if err := rows.Scan(&tr.TurnId, &tr.TrimmedMessages, &at); err != nil {
			return nil, fmt.Errorf("read turn trims: %w", err)
		}
		if at != nil {
			tr.TrimmedAt = timestamppb.New(*at)
		}
		byID[tr.TurnId] = &tr
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read turn trims: %w", err)
	}
	var out []*sessionv1.TurnTrim
	for _, id := range turnIDs {
		if tr := byID[id]; tr != nil {
			out = append(out, tr)
			delete(byID, id) // a turn named twice is listed once
		}
	}
	return out, nil
}

// turnShown is a turn's events as read, with their text's size.
type turnShown struct {
	*sessionv1.TurnShown
	bytes int
	// whole: the turn's prompt event is there, so are the others.
	whole bool
}

// turnEvents reads the checkpoint events of the session's turns named,
// oldest first; the turns whose events are not whole are left out.
func (st *store) turnEvents(ctx context.Context, sessionID string, turnIDs []string) (map[string]*turnShown, error) {
	rows, err := st.db.Query(ctx, `SELECT e.turn_id, e.kind, left(e.content, $3), e.tool_call_id, e.name,
			COALESCE(c.status, ''), t.state <> 'running', t.content, e.created_at,
			t.trimmed_messages, t.trimmed_at
		FROM checkpoint_events e JOIN turns t ON t.turn_id = e.turn_id AND t.session_id = e.session_id
		LEFT JOIN tool_calls c ON e.kind = 'tool_result' AND c.session_id = e.session_id AND c.tool_call_id = e.tool_call_id
		WHERE e.session_id = $1 AND e.turn_id = ANY($2)
		ORDER BY e.seq`, sessionID, turnIDs, maxShownEvent)
	if err != nil {
		return nil, fmt.Errorf("read turn events: %w", err)
	}
	defer rows.Close()
	out := map[string]*turnShown{}
	for rows.Next() {
		var turnID, status, content string
		var ended bool
		var at time.Time
		var trimmed int64
		var trimmedAt *time.Time
		e := &sessionv1.TurnEvent{}
		if err := rows.Scan(&turnID, &e.Kind, &e.Text, &e.ToolCallId, &e.Name, &status, &ended, &content, &at, &trimmed, &trimmedAt); err != nil {
			return nil, fmt.Errorf("read turn events: %w", err)
		}
		e.At = timestamppb.New(at)
		t := out[turnID]
		if t == nil {
			t = &turnShown{TurnShown: &sessionv1.TurnShown{TurnId: turnID, Ended: ended, Content: content, TrimmedMessages: trimmed}, bytes: len(content)}
			if trimmed > 0 && trimmedAt != nil {
				t.TrimmedAt = timestamppb.New(*trimmedAt)
			}
			out[turnID] = t
		}
		switch e.Kind {
		case eventUser:
			t.whole = true
			continue
		case eventToolResult:
			e.Status = status
		}
		t.bytes += len(e.Text) + len(e.Name) + len(e.ToolCallId) + len(e.Status)
		t.Events = append(t.Events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read turn events: %w", err)
	}
	for id, t := range out {
		if !t.whole {
			delete(out, id)
		}
	}
	return out, nil
}

// unendedOf is the ends the session of row holds of the turns asked
// whose write failed (unended.go), read back from the spool where memory
// does not keep them. Until one is written the turn's row reads running,
// without its reply and the events the failed write carried: the end is
// what its clients were told, and what the store will hold.
func (s *Server) unendedOf(row sessionRow, asked []string) map[string]*turnEnd {
	ls := s.liveOf(row)
	if ls == nil {
		return nil
	}
	var ends map[string]*turnEnd
	var spooled []string
	ls.mu.Lock()
	for _, u := range ls.unended {
		if !slices.Contains(asked, u.id) {
			continue
		}
		if ends == nil {
			ends = map[string]*turnEnd{}
		}
		if u.end != nil {
			ends[u.id] = u.end
		} else if u.spooled {
			spooled = append(spooled, u.id)
		}
	}
	ls.mu.Unlock()
	for _, id := range spooled {
		// Read outside the lock: up to a reply's size from the disk.
		end, err := s.spool.load(id)
		if err != nil {
			s.log.Warn("turn end spooled but not read back for its events", zap.String("session_id", row.ID), zap.String("turn_id", id), zap.Error(err))
			continue
		}
		ends[id] = end
	}
	return ends
}

// showUnended gives the turns of shown whose end is held but not written
// (unendedOf) as they ended: ended, its turn_complete's content, and the
// events the failed write carried after those stored. A turn the store
// reads ended had its end written meanwhile, events and all.
func (s *Server) showUnended(ctx context.Context, sessionID string, shown map[string]*turnShown, ends map[string]*turnEnd) error {
	for id, end := range ends {
		t := shown[id]
		if t == nil || t.Ended {
			continue
		}
		var results []string
		for _, ev := range end.events {
			if ev.Kind == eventToolResult {
				results = append(results, ev.ToolCallID)
			}
		}
		statuses, err := s.store.toolStatuses(ctx, sessionID, results)
		if err != nil {
			return err
		}
		t.Ended, t.Content = true, end.res.Content
		t.bytes += len(end.res.Content)
		for _, ev := range end.events {
			if ev.Kind == eventUser {
				continue // its prompt's, stored at its start
			}
			at := ev.At
			if at.IsZero() {
				at = time.Now()
			}
			e := &sessionv1.TurnEvent{Kind: ev.Kind, Text: leftRunes(ev.Content, maxShownEvent), ToolCallId: ev.ToolCallID, Name: ev.Name, At: timestamppb.New(at)}
			if ev.Kind == eventToolResult {
				e.Status = statuses[ev.ToolCallID]
			}
			t.bytes += len(e.Text) + len(e.Name) + len(e.ToolCallId) + len(e.Status)
			t.Events = append(t.Events, e)
		}
	}
	return nil
}

// leftRunes is the first n characters of text, as PostgreSQL's left()
// cuts the stored events.
func leftRunes(text string, n int) string {
	for i := range text {
		if n == 0 {
			return text[:i]
		}
		n--
	}
	return text
}

// toolStatuses reads the status of the session's tool calls named.
func (st *store) toolStatuses(ctx context.Context, sessionID string, toolCallIDs []string) (map[string]string, error) {
	if len(toolCallIDs) == 0 {
		return nil, nil
	}
	rows, err := st.db.Query(ctx, "SELECT tool_call_id, status FROM tool_calls WHERE session_id = $1 AND tool_call_id = ANY($2)", sessionID, toolCallIDs)
	if err != nil {
		return nil, fmt.Errorf("read tool call statuses: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return nil, fmt.Errorf("read tool call statuses: %w", err)
		}
		out[id] = status
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read tool call statuses: %w", err)
	}
	return out, nil
}
