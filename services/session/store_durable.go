package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/pgtext"
)

// Kinds of checkpoint events. user, text, tool_call and tool_result are
// what the provider is given; thought is for people only (hidden
// reasoning never goes back to the model).
const (
	eventUser       = "user"
	eventText       = "text"
	eventThought    = "thought"
	eventToolCall   = "tool_call"
	eventToolResult = "tool_result"
)

// Turn states as stored.
const (
	turnRunning     = "running"
	turnDone        = "done"
	turnInterrupted = "interrupted"
)

// cpEvent is one checkpoint event.
type cpEvent struct {
	SessionID string
	Seq       int64
	TurnID    string
	Step      int
	Kind      string
	Surface   string
	Content   string
	// CallID is the provider's id of a tool call, ToolCallID ours; Name is
	// the tool's.
	CallID, ToolCallID, Name string
	// At is when the event happened (a streamed text's first chunk): a
	// pane rebuilt from the events shows its items at that time, as its
	// followers did. Zero is the write's time.
	At time.Time
	// Marks are where the updates the turn published since its previous
	// batch live, packed (update_marks, migration 0017); nil: none.
	Marks []byte
}

// insertEvents writes events in one statement. Events of a turn that no
// longer exists, its session deleted while it unwound, are skipped: the
// session's id may name another session by then.
func insertEvents(ctx context.Context, q querier, evs []cpEvent) error {
	var cols eventColumns
	return cols.insert(ctx, q, evs)
}

// eventColumns are insertEvents' parameters, a slice a column; the
// checkpoint writer keeps one from batch to batch.
type eventColumns struct {
	sid, turn, kind, surface, content, callID, tcID, name []string
	seq                                                   []int64
	step                                                  []int32
	at                                                    []time.Time
	marks                                                 [][]byte
}

// insert is insertEvents laying evs out in c.
func (c *eventColumns) insert(ctx context.Context, q querier, evs []cpEvent) error {
	if len(evs) == 0 {
		return nil
	}
	c.fill(evs)
	_, err := q.Exec(ctx, `INSERT INTO checkpoint_events
			(session_id, seq, turn_id, step, kind, interaction_surface, content, call_id, tool_call_id, name, created_at, update_marks)
		SELECT u.* FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::text[], $7::text[],
			$8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::bytea[]) AS u(session_id, seq, turn_id, step, kind, interaction_surface, content,
			call_id, tool_call_id, name, created_at, update_marks)
		WHERE EXISTS (SELECT 1 FROM turns t WHERE t.turn_id = u.turn_id AND t.session_id = u.session_id)`,
		c.sid, c.seq, c.turn, c.step, c.kind, c.surface, c.content, c.callID, c.tcID, c.name, c.at, c.marks)
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

// fill lays evs out in c's columns.
func (c *eventColumns) fill(evs []cpEvent) {
	n := len(evs)
	strs := func(s []string) []string { return slices.Grow(s[:0], n) }
	c.sid, c.turn, c.kind, c.surface = strs(c.sid), strs(c.turn), strs(c.kind), strs(c.surface)
	c.content, c.callID, c.tcID, c.name = strs(c.content), strs(c.callID), strs(c.tcID), strs(c.name)
	c.seq, c.step, c.at = slices.Grow(c.seq[:0], n), slices.Grow(c.step[:0], n), slices.Grow(c.at[:0], n)
	c.marks = slices.Grow(c.marks[:0], n)
	now := time.Now()
	for _, e := range evs {
		at := e.At
		if at.IsZero() {
			at = now
		}
		c.at = append(c.at, at)
		c.sid = append(c.sid, e.SessionID)
		c.seq = append(c.seq, e.Seq)
		c.turn = append(c.turn, e.TurnID)
		c.step = append(c.step, int32(e.Step))
		c.kind = append(c.kind, e.Kind)
		c.surface = append(c.surface, e.Surface)
		c.content = append(c.content, pgtext.Text(e.Content))
		c.callID = append(c.callID, pgtext.Text(e.CallID))
		c.tcID = append(c.tcID, e.ToolCallID)
		c.name = append(c.name, pgtext.Text(e.Name))
		c.marks = append(c.marks, e.Marks)
	}
}

// reset lets go of the strings c holds (a longer fill's too: a batch
// retried turn by turn fills fewer), and of columns past maxKeptBatch.
func (c *eventColumns) reset() {
	for _, col := range []*[]string{&c.sid, &c.turn, &c.kind, &c.surface, &c.content, &c.callID, &c.tcID, &c.name} {
		clear((*col)[:cap(*col)])
	}
	clear(c.marks[:cap(c.marks)])
	if cap(c.sid) > maxKeptBatch {
		*c = eventColumns{}
	}
}

// nextEventSeq is the first free event number of a session: above every
// event and above the snapshot's boundary (covered events may be gone).
func nextEventSeq(ctx context.Context, q querier, sessionID string) (int64, error) {
	var next int64
	err := q.QueryRow(ctx, `SELECT GREATEST(
			COALESCE((SELECT max(seq) FROM checkpoint_events WHERE session_id = $1), 0),
			COALESCE((SELECT boundary FROM context_snapshots WHERE session_id = $1), 0)) + 1`, sessionID).Scan(&next)
	return next, err
}

// turnStart is what beginTurn records.
type turnStart struct {
	SessionID, TurnID, ConnID, Surface, Prompt string
	Generation                                 *int64
	// ReserveSeq, when not 0, raises the session's stored update
	// sequence bound to it (reserveSeqSQL) in the same transaction.
	ReserveSeq int64
	// Key is the message the turn answers (PromptRequest's
	// idempotency_key), if any.
	Key string
	// Resume starts the turn as the continuation of a cut turn of the
	// same Key: its prompt is in the transcript and the retained context
	// already, and is not added again.
	Resume bool
}

// errClosedMeanwhile: the session was closed or killed between admit's
// read of its row and the turn's start (another process's close, or a
// bound of its surface closing it to make room: admitOpen).
var errClosedMeanwhile = errors.New("session ended before the turn started")

// beginTurn records a running turn in one transaction: its row, the
// session running, the prompt in the transcript and as the turn's first
// checkpoint event (not when it resumes a cut turn: b.Resume). It returns
// the next free event number; errClosedMeanwhile when the session is no
// longer open.
func (st *store) beginTurn(ctx context.Context, b turnStart) (int64, error) {
	var next int64
	err := pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO turns (turn_id, session_id, connection_id, client_turn_generation, interaction_surface, idempotency_key)
			VALUES ($1, $2, $3, $4, $5, $6)`, b.TurnID, b.SessionID, b.ConnID, b.Generation, b.Surface, b.Key); err != nil {
			return err
		}
		// Until the turn's end stores it again, the last number
		// published is not known: the turn numbers its updates without
		// a write (published_seq).
		tag, err := tx.Exec(ctx, "UPDATE sessions SET state = 'running', updated_at = now(), published_seq = NULL WHERE session_id = $1 AND state = 'idle'", b.SessionID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			// A turn in a closed session ran with nobody counting it
			// open: admitOpen closes idle sessions of a bounded
			// surface from any process, after admit read the row.
			var state string
			if err := tx.QueryRow(ctx, "SELECT state FROM sessions WHERE session_id = $1", b.SessionID).Scan(&state); err != nil {
				return err
			}
			if state == stateClosed || state == stateKilled {
				return errClosedMeanwhile
			}
		}
		if b.ReserveSeq != 0 {
			if _, err := tx.Exec(ctx, reserveSeqSQL, b.SessionID, b.ReserveSeq); err != nil {
				return err
			}
		}
		seq, err := nextEventSeq(ctx, tx, b.SessionID)
		if err != nil {
			return err
		}
		if b.Resume {
			next = seq
			return nil
		}
		// The turn's row is in this transaction: the prompt row names it.
		if _, err := appendMessageTx(ctx, tx, b.SessionID, b.TurnID, roleUser, b.Prompt); err != nil {
			return err
		}
		next = seq + 1
		return insertEvents(ctx, tx, []cpEvent{{SessionID: b.SessionID, Seq: seq, TurnID: b.TurnID, Kind: eventUser, Surface: b.Surface, Content: b.Prompt}})
	})
	if err != nil {
		return 0, fmt.Errorf("start turn: %w", err)
	}
	return next, nil
}

// keyedTurn is the latest turn of a session that answered an
// idempotency key.
type keyedTurn struct {
	Found                                   bool
	ID, State, Outcome, StopReason, Content string
	Surface                                 string
	Generation                              *int64
}

// keyedTurn reads the latest turn of session id started with key.
func (st *store) keyedTurn(ctx context.Context, id, key string) (keyedTurn, error) {
	var k keyedTurn
	err := st.db.QueryRow(ctx, `SELECT turn_id, state, outcome, stop_reason, content, interaction_surface, client_turn_generation
		FROM turns WHERE session_id = $1 AND idempotency_key = $2 ORDER BY started_at DESC LIMIT 1`, id, key).Scan(
		&k.ID, &k.State, &k.Outcome, &k.StopReason, &k.Content, &k.Surface, &k.Generation)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return k, nil
	case err != nil:
		return k, fmt.Errorf("read the turn of an idempotency key: %w", err)
	}
	k.Found = true
	return k, nil
}

// storedMessage is one message of a snapshot, as JSON.
type storedMessage struct {
	Role       string       `json:"role"`
	Content    string       `json:"content"`
	ToolCalls  []storedCall `json:"tool_calls,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
	Name       string       `json:"name,omitempty"`
}

type storedCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// snapshot is a session's latest retained context.
type snapshot struct {
	Found    bool
	Boundary int64
	Messages []ChatMessage
}

// retained reads the retained context: the latest snapshot and the
// provider events after its boundary, oldest first, leaving out thoughts
// and the events of turns left for another surface's recovery.
func (st *store) retained(ctx context.Context, sessionID string) (snapshot, []cpEvent, error) {
	var snap snapshot
	var raw []byte
	err := st.db.QueryRow(ctx, "SELECT boundary, messages FROM context_snapshots WHERE session_id = $1", sessionID).Scan(&snap.Boundary, &raw)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return snap, nil, nil
	case err != nil:
		return snap, nil, fmt.Errorf("read retained context: %w", err)
	}
	snap.Found = true
	var stored []storedMessage
	if err := json.Unmarshal(raw, &stored); err != nil {
		return snap, nil, fmt.Errorf("read retained context: %w", err)
	}
	snap.Messages = fromStored(stored)
	rows, err := st.db.Query(ctx, `SELECT e.seq, e.turn_id, e.step, e.kind, e.content, e.call_id, e.tool_call_id, e.name
		FROM checkpoint_events e JOIN turns t ON t.turn_id = e.turn_id
		WHERE e.session_id = $1 AND e.seq > $2 AND e.kind <> 'thought' AND t.state <> 'interrupted'
		ORDER BY e.seq`, sessionID, snap.Boundary)
	if err != nil {
		return snap, nil, fmt.Errorf("read retained context: %w", err)
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (cpEvent, error) {
		e := cpEvent{SessionID: sessionID}
		err := row.Scan(&e.Seq, &e.TurnID, &e.Step, &e.Kind, &e.Content, &e.CallID, &e.ToolCallID, &e.Name)
		return e, err
	})
	if err != nil {
		return snap, nil, fmt.Errorf("read retained context: %w", err)
	}
	return snap, evs, nil
}

// shownRows is how many of a transcript's newest rows a durable pane
// shows (the bridge's maxViewItems, the most one Transcript page holds).
const shownRows = 2000

// writeSnapshot replaces the session's retained context with msgs,
// covering every event up to boundary, and drops the covered events of
// finished turns, in one transaction: the snapshot and its boundary
// commit together or not at all.
//
// A trim made at a turn's start names the turn (turnID, "" for none) and
// the messages it dropped: the turn's row records them with the snapshot,
// for the notice of a pane rebuilt from the session (TurnEvents).
func (st *store) writeSnapshot(ctx context.Context, sessionID, surface string, boundary int64, msgs []ChatMessage, turnID string, dropped int) error {
	raw, err := json.Marshal(toStored(msgs))
	if err != nil {
		return fmt.Errorf("encode retained context: %w", err)
	}
	err = pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO context_snapshots (session_id, boundary, messages, interaction_surface)
			VALUES ($1, $2, $3, $4) ON CONFLICT (session_id) DO UPDATE
			SET boundary = EXCLUDED.boundary, messages = EXCLUDED.messages,
				interaction_surface = EXCLUDED.interaction_surface, created_at = now()`,
			sessionID, boundary, raw, surface); err != nil {
			return err
		}
		if turnID != "" && dropped > 0 {
			if _, err := tx.Exec(ctx, "UPDATE turns SET trimmed_messages = $3, trimmed_at = now() WHERE turn_id = $1 AND session_id = $2",
				turnID, sessionID, dropped); err != nil {
				return err
			}
		}
		// The events of a turn with rows among the transcript's newest
		// shownRows stay: they are what a pane rebuilt from the session
		// shows of the turn (its thoughts are nowhere else), and the
		// provider reads none at or below the boundary. Dropped with the
		// rest, a trimmed turn came back in a rebuilt pane without its
		// thinking. Those of older turns go, so the events stay bounded
		// by the window.
		_, err := tx.Exec(ctx, `DELETE FROM checkpoint_events e USING turns t
			WHERE e.session_id = $1 AND e.seq <= $2 AND t.turn_id = e.turn_id AND t.state = 'done'
			AND e.turn_id NOT IN (SELECT m.turn_id FROM messages m WHERE m.session_id = $1
				AND m.idx >= (SELECT COALESCE(max(idx), -1) + 1 FROM messages WHERE session_id = $1) - $3)`,
			sessionID, boundary, shownRows)
		return err
	})
	if err != nil {
		return fmt.Errorf("write retained context: %w", err)
	}
	return nil
}

// legacyHistory returns the last n user and assistant transcript rows,
// oldest first: the provider-safe replay of a session that has no
// retained snapshot (one created before snapshots existed). Tool rows
// and markers are for people, not for the model.
func (st *store) legacyHistory(ctx context.Context, id string, n int) ([]ChatMessage, error) {
	// A row past maxReadMessage bytes, written before the bounds, is read
	// as a page reads it (readContentSQL): it was read whole, 50 MB and
	// more, into the provider's context.
	rows, err := st.db.Query(ctx, `SELECT p.role, `+readContentSQL+` FROM (
			SELECT idx, role, content FROM messages WHERE session_id = $1 AND role IN ('user', 'assistant')
			ORDER BY idx DESC LIMIT $2) p ORDER BY p.idx`, id, n)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ChatMessage, error) {
		var m ChatMessage
		var whole *string
		var head []byte
		var size int64
		if err := row.Scan(&m.Role, &whole, &head, &size); err != nil {
			return m, err
		}
		// A row within the bound is the provider's whole, as before; only
		// one past it is cut.
		if whole != nil {
			m.Content = *whole
		} else {
			m.Content = readContent(nil, head, size)
		}
		return m, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	return msgs, nil
}

// recovered is what recoverTurn did.
type recovered struct {
	// Done is false when the turn was not running any more (another
	// recovery got there first).
	Done bool
	// Restored is true when the checkpoint was written into the
	// transcript; false when the turn was left to its own surface.
	Restored bool
	Content  string
}

// recoverTurn ends a turn its process left running, in one transaction,
// so it happens exactly once. With restore, the checkpoint's visible
// progress goes into the transcript (a result for a call that never got
// one, the text so far) followed by marker; without, the turn is marked
// interrupted and its rows are left as they are. A turn marked so is
// restored later (restore) when its surface resumes it (a prompt with
// its idempotency key).
//
// published is the number the turn_complete recovery publishes takes
// (nil when not known), stored as the session's last published number
// (published_seq) in the same transaction, as a live turn's end stores
// it (finishTurnTx).
func (st *store) recoverTurn(ctx context.Context, it interruptedTurn, restore bool, marker string, published *int64) (recovered, error) {
	var rec recovered
	err := pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		rec = recovered{}
		var state string
		var shownSteps int
		err := tx.QueryRow(ctx, "SELECT state, shown_steps FROM turns WHERE turn_id = $1 FOR UPDATE", it.TurnID).Scan(&state, &shownSteps)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && state != turnRunning && !(restore && state == turnInterrupted)) {
			return nil
		}
		if err != nil {
			return err
		}
		rec.Done = true
		res := turnResult{Outcome: OutcomeCancelled, StopReason: stopInterrupted}
		if !restore {
			if _, err := tx.Exec(ctx, `UPDATE turns SET state = 'interrupted', outcome = $2, stop_reason = $3, ended_at = now(), end_seq = $4
				WHERE turn_id = $1`, it.TurnID, res.Outcome, res.StopReason, published); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE approvals SET status = 'cancelled' WHERE turn_id = $1 AND status = 'pending'", it.TurnID); err != nil {
				return err
			}
			// The session is made idle later (recoverRunning), its
			// number stored here.
			_, err := tx.Exec(ctx, "UPDATE sessions SET published_seq = $2 WHERE session_id = $1 AND state = 'running'", it.SessionID, published)
			return err
		}
		rec.Restored = true
		rows, err := tx.Query(ctx, `SELECT step, kind, content, call_id, tool_call_id, name FROM checkpoint_events
			WHERE turn_id = $1 ORDER BY seq`, it.TurnID)
		if err != nil {
			return err
		}
		evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (cpEvent, error) {
			e := cpEvent{SessionID: it.SessionID, TurnID: it.TurnID, Surface: it.Surface}
			err := row.Scan(&e.Step, &e.Kind, &e.Content, &e.CallID, &e.ToolCallID, &e.Name)
			return e, err
		})
		if err != nil {
			return err
		}
		var text []byte
		answered := map[string]bool{}
		for _, e := range evs {
			switch e.Kind {
			case eventText:
				text = append(text, e.Content...)
			case eventToolResult:
				answered[e.ToolCallID] = true
			}
		}
		next, err := nextEventSeq(ctx, tx, it.SessionID)
		if err != nil {
			return err
		}
		// The rows go in the order of the turn's events: the text of a
		// step the transcript lacks (its steps from shownSteps on, see
		// showTextTx) before the rows of the calls that followed it.
		var unshown []byte
		showText := func() error {
			if len(unshown) == 0 {
				return nil
			}
			_, err := appendMessageTx(ctx, tx, it.SessionID, it.TurnID, roleAssistant, string(unshown))
			unshown = unshown[:0]
			return err
		}
		for _, e := range evs {
			if e.Kind == eventText && e.Step >= shownSteps {
				unshown = append(unshown, e.Content...)
			}
			if e.Kind != eventToolCall || answered[e.ToolCallID] {
				continue
			}
			if err := showText(); err != nil {
				return err
			}
			result := e
			result.Kind, result.Seq, result.Content = eventToolResult, next, toolInterruptedOutput
			next++
			if err := insertEvents(ctx, tx, []cpEvent{result}); err != nil {
				return err
			}
			if err := finishToolCallTx(ctx, tx, it.SessionID, e.ToolCallID, toolInterruptedOutput, len(toolInterruptedOutput), toolCancelled); err != nil {
				return err
			}
			if _, err := appendMessageTx(ctx, tx, it.SessionID, it.TurnID, roleTool, e.Name+": "+toolInterruptedOutput); err != nil {
				return err
			}
		}
		if err := showText(); err != nil {
			return err
		}
		rec.Content = string(text)
		res.Content = rec.Content
		if _, err := appendMessageTx(ctx, tx, it.SessionID, it.TurnID, roleSystem, marker); err != nil {
			return err
		}
		return finishTurnTx(ctx, tx, it.SessionID, it.TurnID, res, published, nil)
	})
	if err != nil {
		return rec, fmt.Errorf("recover turn %s: %w", it.TurnID, err)
	}
	return rec, nil
}

func toStored(msgs []ChatMessage) []storedMessage {
	out := make([]storedMessage, 0, len(msgs))
	for _, m := range msgs {
		sm := storedMessage{Role: m.Role, Content: pgtext.Text(m.Content), ToolCallID: pgtext.Text(m.ToolCallID), Name: pgtext.Text(m.Name)}
		for _, c := range m.ToolCalls {
			sm.ToolCalls = append(sm.ToolCalls, storedCall{ID: pgtext.Text(c.ID), Name: pgtext.Text(c.Name), Arguments: pgtext.Text(c.Arguments)})
		}
		out = append(out, sm)
	}
	return out
}

func fromStored(stored []storedMessage) []ChatMessage {
	out := make([]ChatMessage, 0, len(stored))
	for _, sm := range stored {
		m := ChatMessage{Role: sm.Role, Content: sm.Content, ToolCallID: sm.ToolCallID, Name: sm.Name}
		for _, c := range sm.ToolCalls {
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
		out = append(out, m)
	}
	return out
}
