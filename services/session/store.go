package session

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/pgtext"
	"github.com/clawmesh/clawmesh/services/session/provider"
)

// Session states as stored and as session/state reports them.
const (
	stateIdle    = "idle"
	stateRunning = "running"
	stateClosed  = "closed"
	stateKilled  = "killed"
)

// Transcript roles: the provider's, and system for markers.
const (
	roleUser      = provider.RoleUser
	roleAssistant = provider.RoleAssistant
	roleTool      = provider.RoleTool
	roleSystem    = provider.RoleSystem
)

// errNoRow is what the store returns for a missing session or approval.
var errNoRow = errors.New("no such row")

// store is the session schema: every SQL statement of the service lives
// here (and in store_durable.go). Nobody else reads these tables.
type store struct {
	db   *pgxpool.Pool
	kept kept // reads kept until the next write (kept.go)
}

// querier is a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type sessionRow struct {
	ID            string
	AgentAlias    string
	Owner         string
	State         string
	Generation    int64
	Surface       string
	WorkspaceDir  string
	Title         string
	Cwd           string
	MessageCount  int64
	UpdateSeq     int64
	AlwaysAllowed []string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// Incarnation tells this session from any other its id names before
	// or after it (migrations/0004): uploads and its updates' subject carry it.
	Incarnation int64
	// LastSeq is the last update seq known used (published_seq), or
	// UpdateSeq when not known: what UpdateSeqs answers without a live
	// half.
	LastSeq int64
}

const sessionColumns = `session_id, agent_alias, owner, state, generation, interaction_surface, workspace_dir,
	title, cwd, message_count, update_seq, COALESCE(published_seq, update_seq), always_allowed, created_at, updated_at, incarnation`

func scanSession(row pgx.Row) (sessionRow, error) {
	var r sessionRow
	err := row.Scan(&r.ID, &r.AgentAlias, &r.Owner, &r.State, &r.Generation, &r.Surface, &r.WorkspaceDir,
		&r.Title, &r.Cwd, &r.MessageCount, &r.UpdateSeq, &r.LastSeq, &r.AlwaysAllowed, &r.CreatedAt, &r.UpdatedAt, &r.Incarnation)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, errNoRow
	}
	return r, err
}

func (st *store) session(ctx context.Context, id string) (sessionRow, error) {
	r, err := scanSession(st.db.QueryRow(ctx, "SELECT "+sessionColumns+" FROM sessions WHERE session_id = $1", id))
	if err != nil && !errors.Is(err, errNoRow) {
		return r, fmt.Errorf("read session: %w", err)
	}
	return r, err
}

// MaxOpenSessions bounds the sessions one principal has open (idle or
// running). Every status lists the caller's open sessions, the
// operator's all of them, in one message between the processes: some
// 540,000 ids pass its 16 MiB, and a principal making sessions in a loop
// made the operator's status fail for good.
const MaxOpenSessions = 1000

// MaxKeptSessions bounds the sessions a user keeps, open or not: a closed
// session keeps its rows and its workspace until it is deleted, and a
// user making and closing sessions in a loop kept any number of them
// (1,200 in 18 s in an audit). The operator, the machine's own user, is
// not bounded: its sessions are its history, and its disk its own.
const MaxKeptSessions = 10000

// MaxOpenChannelSessions bounds the operator's open sessions of channel
// conversations (surface "channel:<alias>"), apart from MaxOpenSessions:
// a channel's senders are outside the machine, each thread they write
// on is a session of the operator's, and counted with the operator's
// own they could take every one of them (each alias closes its idle
// conversations past its max_sessions, but aliases and sandbox replicas
// add up). Only the operator's are counted apart: a user naming its
// sessions' surface "channel:" gets no second allowance.
const MaxOpenChannelSessions = 1000

// channelSurfacePrefix begins the interaction surface of a channel
// conversation's session (the plugin sandbox's channel_sessions.go).
const channelSurfacePrefix = "channel:"

// errOpenLimit: the owner has MaxOpenSessions open.
var errOpenLimit = errors.New("open sessions at the limit")

// errChannelOpenLimit: the operator has MaxOpenChannelSessions channel
// conversations open.
var errChannelOpenLimit = fmt.Errorf("channel conversations: %w", errOpenLimit)

// errKeptLimit: the owner, a user, keeps MaxKeptSessions sessions.
var errKeptLimit = errors.New("kept sessions at the limit")

// openLockClass is the first key of the per-owner admission lock
// ("CMSO"; policylock's class is "CMSH").
const openLockClass int32 = 0x434d534f

// errSurfaceBusy: the operator has its bound (max_open_of_surface) of a
// surface's sessions open, and every one runs a turn.
var errSurfaceBusy = errors.New("every open session of the surface runs a turn")

// admitOpen serializes, for the rest of tx, the sessions of owner made or
// reopened, and refuses when the owner has MaxOpenSessions open or, making
// one (adding), a user keeps MaxKeptSessions. With maxOfSurface (the
// operator's only), it first closes what passes that bound of surface's
// open sessions (boundSurface).
func admitOpen(ctx context.Context, tx pgx.Tx, owner, surface string, adding bool, maxOfSurface int) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", openLockClass, owner); err != nil {
		return err
	}
	if maxOfSurface > 0 && owner == configschema.OperatorPrincipal {
		if err := boundSurface(ctx, tx, owner, surface, maxOfSurface); err != nil {
			return err
		}
	}
	// The open ones are counted on their own index; all of a user's only
	// when it makes one (the operator's history, which may be long, never).
	var open, kept int
	var err error
	switch {
	case adding && owner != configschema.OperatorPrincipal:
		err = tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state IN ('idle', 'running')), count(*) FROM sessions WHERE owner = $1",
			owner).Scan(&open, &kept)
	case owner == configschema.OperatorPrincipal:
		// The operator's channel conversations and its own sessions
		// each against their own bound (MaxOpenChannelSessions).
		channel := strings.HasPrefix(surface, channelSurfacePrefix)
		err = tx.QueryRow(ctx, "SELECT count(*) FROM sessions WHERE owner = $1 AND state IN ('idle', 'running') AND starts_with(interaction_surface, $2) = $3",
			owner, channelSurfacePrefix, channel).Scan(&open)
		if err == nil && channel && open >= MaxOpenChannelSessions {
			return errChannelOpenLimit
		}
	default:
		err = tx.QueryRow(ctx, "SELECT count(*) FROM sessions WHERE owner = $1 AND state IN ('idle', 'running')", owner).Scan(&open)
	}
	if err != nil {
		return err
	}
	switch {
	case open >= MaxOpenSessions:
		return errOpenLimit
	case kept >= MaxKeptSessions:
		return errKeptLimit
	}
	return nil
}

// boundSurface closes, to make room for one more, the least recently
// active idle sessions of owner's surface past max open, in tx, under
// admitOpen's lock; errSurfaceBusy when every one runs a turn. A channel
// alias's max_sessions was held by each sandbox replica over the
// conversations it had opened itself: with every replica sharing the
// channel's listener, N replicas kept N times the bound open. Counted
// here, under the lock every opening of the owner's sessions takes, it
// holds whichever replica opens. A session a turn is starting on
// meanwhile holds its row's lock (beginTurn), and is skipped; one closed
// after admit read it is refused its turn (errClosedMeanwhile), and its
// conversation's next delivery reopens it.
func boundSurface(ctx context.Context, tx pgx.Tx, owner, surface string, max int) error {
	var open int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM sessions WHERE owner = $1 AND interaction_surface = $2 AND state IN ('idle', 'running')",
		owner, surface).Scan(&open); err != nil {
		return err
	}
	if open < max {
		return nil
	}
	// The victims in a CTE, read once: as an IN subquery PostgreSQL may
	// run it again per row, and SKIP LOCKED then skips the rows this
	// statement has just locked and picks more (twice the victims in a
	// test).
	tag, err := tx.Exec(ctx, `WITH victims AS (
			SELECT session_id FROM sessions WHERE owner = $1 AND interaction_surface = $2 AND state = 'idle'
			ORDER BY updated_at LIMIT $3 FOR UPDATE SKIP LOCKED)
		UPDATE sessions AS s SET state = 'closed', updated_at = now() FROM victims AS v
		WHERE s.session_id = v.session_id`, owner, surface, open-max+1)
	if err != nil {
		return err
	}
	if tag.RowsAffected() < int64(open-max+1) {
		return errSurfaceBusy
	}
	return nil
}

// createSession inserts a new idle session with an explicitly empty
// retained context and returns its incarnation; 0 when the id is taken,
// and errOpenLimit when the owner has MaxOpenSessions open. maxOfSurface
// is admitOpen's.
func (st *store) createSession(ctx context.Context, r sessionRow, maxOfSurface int) (incarnation int64, err error) {
	err = pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		if err := admitOpen(ctx, tx, r.Owner, r.Surface, true, maxOfSurface); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `INSERT INTO sessions (session_id, agent_alias, owner, state, interaction_surface, workspace_dir, cwd)
			VALUES ($1, $2, $3, 'idle', $4, $5, $6) ON CONFLICT (session_id) DO NOTHING RETURNING incarnation`,
			r.ID, r.AgentAlias, r.Owner, r.Surface, r.WorkspaceDir, r.Cwd).Scan(&incarnation)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO context_snapshots (session_id, boundary, messages, interaction_surface)
			VALUES ($1, 0, '[]', $2)`, r.ID, r.Surface)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("create session: %w", err)
	}
	return incarnation, nil
}

// reopen makes a closed (or idle) session of owner idle again in a new
// generation; errOpenLimit when the owner has MaxOpenSessions open.
// maxOfSurface is admitOpen's.
func (st *store) reopen(ctx context.Context, id, owner, surface, cwd string, maxOfSurface int) (sessionRow, error) {
	var r sessionRow
	err := pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		if err := admitOpen(ctx, tx, owner, surface, false, maxOfSurface); err != nil {
			return err
		}
		var err error
		r, err = scanSession(tx.QueryRow(ctx, `UPDATE sessions SET state = 'idle', generation = generation + 1,
			cwd = CASE WHEN $2 = '' THEN cwd ELSE $2 END, updated_at = now()
			WHERE session_id = $1 AND state IN ('idle', 'closed') RETURNING `+sessionColumns, id, cwd))
		return err
	})
	if err != nil && !errors.Is(err, errNoRow) && !errors.Is(err, errOpenLimit) && !errors.Is(err, errSurfaceBusy) {
		return r, fmt.Errorf("reopen session: %w", err)
	}
	return r, err
}

// setState moves a session to state when it is in one of from; it reports
// whether it did.
func (st *store) setState(ctx context.Context, id, state string, from ...string) (bool, error) {
	tag, err := st.db.Exec(ctx, "UPDATE sessions SET state = $2, updated_at = now() WHERE session_id = $1 AND state = ANY($3)", id, state, from)
	if err != nil {
		return false, fmt.Errorf("set session state: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// deleteSession deletes the session id of the given incarnation (never
// a new session its id names since), and frees what its stored files
// held of its owner's quota (files.go, chargeStored). The row is locked
// first: a store into the session that holds it ends before the files
// are summed, each read then seeing what committed before it.
func (st *store) deleteSession(ctx context.Context, id string, incarnation int64) (bool, error) {
	var deleted bool
	err := pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		var owner string
		err := tx.QueryRow(ctx, "SELECT owner FROM sessions WHERE session_id = $1 AND incarnation = $2 FOR UPDATE",
			id, incarnation).Scan(&owner)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if owner != configschema.OperatorPrincipal {
			if _, err := tx.Exec(ctx, `UPDATE stored_usage AS u SET bytes = greatest(u.bytes - f.bytes, 0), files = greatest(u.files - f.files, 0)
				FROM (SELECT coalesce(sum(size_bytes), 0) AS bytes, count(*) AS files FROM session_files WHERE session_id = $1) AS f
				WHERE u.owner = $2 AND f.files > 0`, id, owner); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, "DELETE FROM sessions WHERE session_id = $1", id)
		deleted = tag.RowsAffected() == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("delete session: %w", err)
	}
	return deleted, nil
}

// missingSessions returns those of ids no session row holds.
func (st *store) missingSessions(ctx context.Context, ids []string) ([]string, error) {
	rows, err := st.db.Query(ctx, `SELECT id FROM unnest($1::text[]) AS id
		WHERE NOT EXISTS (SELECT 1 FROM sessions WHERE session_id = id)`, ids)
	if err != nil {
		return nil, fmt.Errorf("look up sessions: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("look up sessions: %w", err)
	}
	return out, nil
}

// listSessions lists sessions newest first: the owner's, or everyone's
// when owner is empty (the operator).
func (st *store) listSessions(ctx context.Context, owner string, limit int64, includeClosed bool) ([]sessionRow, error) {
	return st.sessionPage(ctx, owner, includeClosed, nil, limit)
}

// openSession is an open session's id and owner.
type openSession struct{ ID, Owner string }

func (st *store) openSessions(ctx context.Context) ([]openSession, error) {
	rows, err := st.db.Query(ctx, "SELECT session_id, owner FROM sessions WHERE state IN ('idle', 'running') ORDER BY updated_at DESC")
	if err != nil {
		return nil, fmt.Errorf("list open sessions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (openSession, error) {
		var o openSession
		err := row.Scan(&o.ID, &o.Owner)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("list open sessions: %w", err)
	}
	return out, nil
}

// errTurnGone: a turn's write found its turn row gone, with the session
// it ran in (deleted while the turn unwound). Nothing of it is written:
// the id may name another session by then, another principal's.
var errTurnGone = errors.New("the turn's session was deleted")

// appendMessageTx adds one transcript row at the next index, taken under
// the session row's lock: indexes are dense, in commit order, never
// reused. The row carries the session's interaction surface and its
// turn's id. A turn's row (turnID not empty) is written only while the turn's own row stands,
// so errTurnGone once its session was deleted: a turn that outlived its
// session's Delete wrote its reply into the next session of that id.
func appendMessageTx(ctx context.Context, tx pgx.Tx, id, turnID, role, content string) (int64, error) {
	var idx int64
	err := tx.QueryRow(ctx, `UPDATE sessions SET message_count = message_count + 1, updated_at = now()
		WHERE session_id = $1 AND ($2 = '' OR EXISTS (SELECT 1 FROM turns WHERE turn_id = $2 AND session_id = $1))
		RETURNING message_count - 1`, id, turnID).Scan(&idx)
	if errors.Is(err, pgx.ErrNoRows) && turnID != "" {
		return 0, errTurnGone
	}
	if err != nil {
		return 0, err
	}
	content = pgtext.Text(content)
	_, err = tx.Exec(ctx, `INSERT INTO messages (session_id, idx, role, content, json_size, interaction_surface, turn_id)
		SELECT $1, $2, $3, $4, $5, interaction_surface, $6 FROM sessions WHERE session_id = $1`, id, idx, role, content, jsonSize(content), turnID)
	return idx, err
}

// jsonSize is what s takes as a JSON string, its quotes included (a
// message is at most a frame, so this is far within an integer column).
func jsonSize(s string) int32 {
	_, n := jsonstr.Fit(s, math.MaxInt)
	return int32(min(n+2, math.MaxInt32))
}

// maxReadMessage bounds one message as a page carries it, measured as
// JSON: a page holds at least one message, and a client reads a page in
// one frame of 8 MiB. A prompt arrives within that frame and a reply is at
// most 4 MiB of JSON, so only a message written before these bounds (the
// largest were megabytes past 16 MiB, which no page could carry) or a
// prompt of the frame's whole size is read cut, saying so at its end.
const maxReadMessage = 8<<20 - 64<<10

// readNote ends a message read cut.
const readNote = "\n[message cut when read: %d of its %d bytes shown]"

// cutForRead cuts a message read for a page to maxReadMessage as JSON.
func cutForRead(s string) string {
	if len(s) <= maxReadMessage/6 {
		return s
	}
	return cutJSON(s, maxReadMessage, readNote)
}

// readContentSQL reads the column p.content of a page (pageSQL) as three:
// the content when it is at most maxReadMessage bytes, else NULL; else
// its first maxReadMessage bytes (bytea, maybe ending within a
// character); and its size in bytes. Read whole, a row written before
// the bounds (50 MB and more) crossed from PostgreSQL and was held whole
// in the session service, twice (the read buffer and the string), to be
// cut at once to maxReadMessage. A reader's cut of a message as JSON is
// never past maxReadMessage bytes of it, so the start is all it takes,
// and the size tells the note. left() takes characters, so PostgreSQL
// reads at most four bytes a character of a large row, not all of it.
var readContentSQL = fmt.Sprintf(`CASE WHEN octet_length(p.content) <= %[1]d THEN p.content END,
	CASE WHEN octet_length(p.content) > %[1]d THEN substring(convert_to(left(p.content, %[1]d), 'UTF8') from 1 for %[1]d) END,
	octet_length(p.content)`, maxReadMessage)

// readContent is a message read for a page from readContentSQL's
// columns: whole, head and total.
func readContent(whole *string, head []byte, total int64) string {
	if whole != nil {
		return cutForRead(*whole)
	}
	// The start ends at a byte, maybe within a character: that
	// character is left out (the cut ends far before it).
	for i := len(head) - 1; i >= max(0, len(head)-utf8.UTFMax); i-- {
		if utf8.RuneStart(head[i]) {
			if !utf8.FullRune(head[i:]) {
				head = head[:i]
			}
			break
		}
	}
	return cutJSONOf(string(head), int(min(total, math.MaxInt32)), maxReadMessage, readNote)
}

type messageRow struct {
	Index   int64
	Role    string
	Content string
}

// messages returns up to limit rows before beforeIndex (all when < 0),
// oldest first, and the transcript's total length.
// pageSQL is the query of one page of a session's messages: the columns
// cols of the rows matching cond ($1 is the session, $2 an index bound),
// at most $3 of them counted from the newest or the oldest end, ending
// before the row that takes their content past $4 bytes of JSON but
// holding at least one; oldest first. upto is the content's JSON from the
// page's first row to this one, summed in the order the page is taken.
func pageSQL(cols, cond string, newestFirst bool) string {
	order := "idx"
	if newestFirst {
		order = "idx DESC"
	}
	// Integers, not bigints: PostgreSQL sums an integer into a bigint but
	// a bigint into a numeric, which made each page 15% slower. A row
	// written before json_size (NULL) counts six bytes a byte, capped so
	// the product stays an integer (such a row is a page alone anyway).
	const size = `COALESCE(json_size, LEAST(octet_length(content), 300000000) * 6)`
	return `SELECT ` + cols + ` FROM (
			SELECT ` + cols + `, ` + size + ` AS size,
				sum(` + size + `) OVER (ORDER BY ` + order + ` ROWS UNBOUNDED PRECEDING) AS upto
			FROM messages WHERE session_id = $1 AND ` + cond + `
			ORDER BY ` + order + ` LIMIT $3) page
		WHERE upto <= $4 OR upto = size ORDER BY idx`
}

func (st *store) messages(ctx context.Context, id string, limit, beforeIndex int64) ([]messageRow, int64, error) {
	rows, err := st.db.Query(ctx, countedPageSQL(pageSQL("idx, role, content", "($2 < 0 OR idx < $2)", true), "p.idx, p.role, "+readContentSQL),
		id, beforeIndex, limit, pageBytes)
	if err != nil {
		return nil, 0, fmt.Errorf("read messages: %w", err)
	}
	var total int64
	found := false
	msgs := []messageRow{}
	for rows.Next() {
		var idx, size *int64
		var role, content *string
		var head []byte
		if err := rows.Scan(&total, &idx, &role, &content, &head, &size); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("read messages: %w", err)
		}
		found = true
		if idx != nil {
			msgs = append(msgs, messageRow{Index: *idx, Role: *role, Content: readContent(content, head, *size)})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read messages: %w", err)
	}
	if !found {
		return nil, 0, errNoRow
	}
	return msgs, total, nil
}

// countedPageSQL is page, a pageSQL query, with the transcript's length
// (message_count) in front of each of its rows, cols (page's columns as
// p.<name>), and one row of NULLs when the page is empty: no row at all
// says there is no session. One statement reads both at one moment. Read
// apart, a message committed between the count and the page was in the
// page and not in the total: the newest page held an index at the total
// or past it (18 pages of 400 read while another connection prompted),
// and the durable bridge, which goes on from the total, showed it twice.
func countedPageSQL(page, cols string) string {
	return `SELECT s.message_count, ` + cols + ` FROM sessions s LEFT JOIN (` + page + `) p ON true
		WHERE s.session_id = $1 ORDER BY p.idx`
}

// finishTurnTx records a turn's outcome and makes a running session idle
// again (a session closed meanwhile keeps its state).
//
// published is the number the turn's turn_complete takes, published
// next (published_seq), or nil when not known (the live half's start
// was not read from the stored bound; or a surface's restore of a turn
// recovery already ended, which publishes nothing).
//
// updateMap is where the turn's updates live in its checkpoint events
// (turns.update_map), nil when not known.
func finishTurnTx(ctx context.Context, tx pgx.Tx, sessionID, turnID string, res turnResult, published *int64, updateMap []int64) error {
	// end_seq is kept when published is not known: a restore of a turn
	// recovery ended keeps the number that recovery's turn_complete took.
	tag, err := tx.Exec(ctx, `UPDATE turns SET state = 'done', outcome = $2, stop_reason = $3, content = $4, ended_at = now(),
		end_seq = COALESCE($5, end_seq), error = $6, update_map = $7
		WHERE turn_id = $1`, turnID, res.Outcome, res.StopReason, pgtext.Text(res.Content), published, pgtext.Text(res.Error), updateMap)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errTurnGone // and the session of this id, if any, is another's
	}
	if _, err := tx.Exec(ctx, "UPDATE approvals SET status = 'cancelled' WHERE turn_id = $1 AND status = 'pending'", turnID); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "UPDATE sessions SET state = 'idle', updated_at = now(), published_seq = $2 WHERE session_id = $1 AND state = 'running'",
		sessionID, published)
	return err
}

// interruptedTurn is a turn left running by a process that died.
type interruptedTurn struct {
	SessionID, TurnID, Surface string
	Generation                 *int64
}

func (st *store) interruptedTurns(ctx context.Context) ([]interruptedTurn, error) {
	rows, err := st.db.Query(ctx, `SELECT session_id, turn_id, interaction_surface, client_turn_generation
		FROM turns WHERE state = 'running' ORDER BY started_at`)
	if err != nil {
		return nil, fmt.Errorf("find interrupted turns: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (interruptedTurn, error) {
		var t interruptedTurn
		err := row.Scan(&t.SessionID, &t.TurnID, &t.Surface, &t.Generation)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("find interrupted turns: %w", err)
	}
	return out, nil
}

func insertToolCallTx(ctx context.Context, q querier, sessionID, turnID string, c toolCall, status string) error {
	// Written only while the turn's row stands (see errTurnGone).
	_, err := q.Exec(ctx, `INSERT INTO tool_calls (session_id, tool_call_id, turn_id, name, raw_input, status)
		SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM turns WHERE turn_id = $3 AND session_id = $1)`,
		sessionID, c.ID, turnID, pgtext.Text(c.Name), string(c.Arguments), status)
	return err
}

func finishToolCallTx(ctx context.Context, q querier, sessionID, callID, output string, outputBytes int, status string) error {
	_, err := q.Exec(ctx, "UPDATE tool_calls SET raw_output = $3, status = $4, output_bytes = $5 WHERE session_id = $1 AND tool_call_id = $2",
		sessionID, callID, pgtext.Text(output), status, outputBytes)
	return err
}

func (st *store) insertApproval(ctx context.Context, sessionID, turnID string, a *approval) error {
	if _, err := st.db.Exec(ctx, `INSERT INTO approvals (request_id, session_id, turn_id, tool_call_id, tool_name, arguments_summary, timeout_secs)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, a.RequestID, sessionID, turnID, a.ToolCallID, a.ToolName, a.Summary, a.timeoutSecs()); err != nil {
		return fmt.Errorf("record approval request: %w", err)
	}
	return nil
}

// decideApproval stores d as the decision of session sessionID's pending
// approval requestID. An UPDATE that matched no such row stored nothing:
// errApprovalMissing when there is no row, errApprovalSettled when it is
// no longer pending (read only then, so a stored decision costs one
// statement).
func (st *store) decideApproval(ctx context.Context, sessionID, requestID string, d decision) error {
	tag, err := st.db.Exec(ctx, `UPDATE approvals SET status = 'decided', decision = $3, surface = $4, replacement = $5, decided_at = now()
		WHERE request_id = $1 AND session_id = $2 AND status = 'pending'`, requestID, sessionID, d.Decision, d.Surface, d.Replacement)
	if err != nil {
		return fmt.Errorf("record approval decision: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var status string
	err = st.db.QueryRow(ctx, "SELECT status FROM approvals WHERE request_id = $1 AND session_id = $2", requestID, sessionID).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("record approval decision: %w", errApprovalMissing)
	case err != nil:
		return fmt.Errorf("record approval decision: read the row that did not match: %w", err)
	}
	return fmt.Errorf("record approval decision: %w (it is %s)", errApprovalSettled, status)
}

// approvalStatus reads a stored approval's session, status and, once
// settled, decision (decision and surface, empty while pending).
func (st *store) approvalStatus(ctx context.Context, requestID string) (sessionID, status string, d decision, err error) {
	err = st.db.QueryRow(ctx, "SELECT session_id, status, decision, surface FROM approvals WHERE request_id = $1", requestID).
		Scan(&sessionID, &status, &d.Decision, &d.Surface)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", decision{}, errNoRow
	}
	if err != nil {
		return "", "", decision{}, fmt.Errorf("read approval: %w", err)
	}
	return sessionID, status, d, nil
}

func (st *store) allowAlways(ctx context.Context, sessionID, tool string) error {
	if _, err := st.db.Exec(ctx, `UPDATE sessions SET always_allowed = array_append(always_allowed, $2)
		WHERE session_id = $1 AND NOT ($2 = ANY(always_allowed))`, sessionID, tool); err != nil {
		return fmt.Errorf("record allow_always: %w", err)
	}
	return nil
}

// liveState reads what a session's in-memory half starts from: the stored
// update sequence bound and the tools allow_always approved.
//
// last is the last number published as stored (published_seq), seq
// when that is not known.
func (st *store) liveState(ctx context.Context, id string) (seq, last int64, allowed []string, err error) {
	err = st.db.QueryRow(ctx, "SELECT update_seq, COALESCE(published_seq, update_seq), always_allowed FROM sessions WHERE session_id = $1", id).
		Scan(&seq, &last, &allowed)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, nil, errNoRow
	}
	if err != nil {
		return 0, 0, nil, fmt.Errorf("read session: %w", err)
	}
	return seq, last, allowed, nil
}

// reserveSeqSQL raises session $1's stored sequence bound to $2; a bound
// already higher stays.
const reserveSeqSQL = "UPDATE sessions SET update_seq = GREATEST(update_seq, $2) WHERE session_id = $1"

// reserveSeqAfter raises the session's stored sequence bound to block
// numbers past both seq and the bound stored before, and returns the new
// bound: the numbers from it less block up to it are the caller's.
func (st *store) reserveSeqAfter(ctx context.Context, sessionID string, seq, block int64) (int64, error) {
	var upto int64
	err := st.db.QueryRow(ctx, "UPDATE sessions SET update_seq = GREATEST(update_seq, $2) + $3 WHERE session_id = $1 RETURNING update_seq",
		sessionID, seq, block).Scan(&upto)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("reserve update sequence: %w", errNoRow)
	}
	if err != nil {
		return 0, fmt.Errorf("reserve update sequence: %w", err)
	}
	return upto, nil
}

// releaseSeq lowers the stored bound from reserved to the last sequence
// really used, at a clean stop, so the next process continues without a
// gap; it is the last number published too (published_seq). A bound
// someone else raised meanwhile is left alone.
func (st *store) releaseSeq(ctx context.Context, sessionID string, used, reserved int64) error {
	if _, err := st.db.Exec(ctx, "UPDATE sessions SET update_seq = $2, published_seq = $2 WHERE session_id = $1 AND update_seq = $3",
		sessionID, used, reserved); err != nil {
		return fmt.Errorf("release update sequence: %w", err)
	}
	return nil
}

// recoverRunning makes sessions left running by a dead process idle.
func (st *store) recoverRunning(ctx context.Context) error {
	if _, err := st.db.Exec(ctx, "UPDATE sessions SET state = 'idle' WHERE state = 'running'"); err != nil {
		return fmt.Errorf("recover running sessions: %w", err)
	}
	if _, err := st.db.Exec(ctx, "UPDATE approvals SET status = 'cancelled' WHERE status = 'pending'"); err != nil {
		return fmt.Errorf("recover pending approvals: %w", err)
	}
	return nil
}
