package durablebridge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Memory bounds. The wire asks for at least 500 of each; a margin keeps
// pruning off the hot path.
const (
	keptRequestIDs = 1000
	keptDecided    = 600
	pruneEvery     = 64
	// maxQueuedPerPane bounds the texts waiting for a pane's next turn.
	maxQueuedPerPane = 32
)

// errNoRow: nothing stored under that key.
var errNoRow = errors.New("no such row")

// store is the bridge's schema: every SQL statement of the bridge is here.
type store struct {
	db *pgxpool.Pool
	// timeout bounds each of the store's calls (storeTimeout when 0).
	// Some run on a context without the caller's cancellation, the phone
	// gone or not, so that its retry finds the answer: with no deadline of
	// their own, a stalled database or a lock held on a table kept them,
	// their POST's in-flight slot and handler, and the bridge's shutdown,
	// waiting for as long as it lasted.
	timeout time.Duration
}

// storeTimeout is a store call's bound when the store names none.
const storeTimeout = 5 * time.Second

// bound gives ctx the store's deadline.
func (st *store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if st.timeout > 0 {
		return context.WithTimeout(ctx, st.timeout)
	}
	return context.WithTimeout(ctx, storeTimeout)
}

// newEpoch draws a random 128-bit epoch that was never used, and records
// it.
func (st *store) newEpoch(ctx context.Context) (string, error) {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	for {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("draw epoch: %w", err)
		}
		epoch := hex.EncodeToString(b)
		tag, err := st.db.Exec(ctx, "INSERT INTO epochs (epoch) VALUES ($1) ON CONFLICT DO NOTHING", epoch)
		if err != nil {
			return "", fmt.Errorf("record epoch: %w", err)
		}
		if tag.RowsAffected() == 1 {
			// Request ids are an epoch's own: the old ones can never match.
			if _, err := st.db.Exec(ctx, "DELETE FROM request_ids WHERE epoch <> $1", epoch); err != nil {
				return "", fmt.Errorf("forget old request ids: %w", err)
			}
			return epoch, nil
		}
	}
}

// storedResponse is a request id's first answer.
type storedResponse struct {
	fingerprint []byte
	status      int
	body        []byte
}

func (st *store) response(ctx context.Context, epoch, requestID string) (storedResponse, error) {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	var r storedResponse
	err := st.db.QueryRow(ctx, "SELECT fingerprint, status, body FROM request_ids WHERE epoch = $1 AND request_id = $2",
		epoch, requestID).Scan(&r.fingerprint, &r.status, &r.body)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, errNoRow
	}
	if err != nil {
		return r, fmt.Errorf("read request id: %w", err)
	}
	return r, nil
}

// remember stores a request id's first answer; every pruneEvery calls it
// forgets all but the newest keptRequestIDs of the epoch.
func (st *store) remember(ctx context.Context, epoch, requestID string, r storedResponse, prune bool) error {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	if _, err := st.db.Exec(ctx, `INSERT INTO request_ids (epoch, request_id, fingerprint, status, body)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, epoch, requestID, r.fingerprint, r.status, r.body); err != nil {
		return fmt.Errorf("remember request id: %w", err)
	}
	if prune {
		if _, err := st.db.Exec(ctx, `DELETE FROM request_ids WHERE epoch = $1 AND seq < (
			SELECT seq FROM request_ids WHERE epoch = $1 ORDER BY seq DESC OFFSET $2 LIMIT 1)`, epoch, keptRequestIDs-1); err != nil {
			return fmt.Errorf("prune request ids: %w", err)
		}
	}
	return nil
}

// decided is how an ask ended.
type decided struct {
	by, outcome string
}

func (st *store) recordDecided(ctx context.Context, paneID, askID string, d decided) error {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	tag, err := st.db.Exec(ctx, `INSERT INTO decided_asks (pane_id, ask_id, decided_by, outcome) VALUES ($1, $2, $3, $4)
		ON CONFLICT DO NOTHING`, paneID, askID, d.by, d.outcome)
	if err != nil {
		return fmt.Errorf("record decided ask: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	if _, err := st.db.Exec(ctx, `DELETE FROM decided_asks WHERE pane_id = $1 AND seq < (
		SELECT seq FROM decided_asks WHERE pane_id = $1 ORDER BY seq DESC OFFSET $2 LIMIT 1)`, paneID, keptDecided-1); err != nil {
		return fmt.Errorf("prune decided asks: %w", err)
	}
	return nil
}

func (st *store) decidedAsk(ctx context.Context, paneID, askID string) (decided, error) {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	var d decided
	err := st.db.QueryRow(ctx, "SELECT decided_by, outcome FROM decided_asks WHERE pane_id = $1 AND ask_id = $2",
		paneID, askID).Scan(&d.by, &d.outcome)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, errNoRow
	}
	if err != nil {
		return d, fmt.Errorf("read decided ask: %w", err)
	}
	return d, nil
}

// forgetPane drops what the bridge keeps about a deleted session.
func (st *store) forgetPane(ctx context.Context, paneID string) error {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	if _, err := st.db.Exec(ctx, "DELETE FROM decided_asks WHERE pane_id = $1", paneID); err != nil {
		return fmt.Errorf("forget pane: %w", err)
	}
	if _, err := st.db.Exec(ctx, "DELETE FROM queued_sends WHERE pane_id = $1", paneID); err != nil {
		return fmt.Errorf("forget pane: %w", err)
	}
	return nil
}

func (st *store) titles(ctx context.Context) (map[string]string, error) {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	rows, err := st.db.Query(ctx, "SELECT target, title FROM titles")
	if err != nil {
		return nil, fmt.Errorf("read titles: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("read titles: %w", err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read titles: %w", err)
	}
	return out, nil
}

func (st *store) setTitle(ctx context.Context, target, title string) error {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	if _, err := st.db.Exec(ctx, `INSERT INTO titles (target, title) VALUES ($1, $2)
		ON CONFLICT (target) DO UPDATE SET title = EXCLUDED.title`, target, title); err != nil {
		return fmt.Errorf("store title: %w", err)
	}
	return nil
}

// errQueueFull: the pane already has maxQueuedPerPane texts waiting.
var errQueueFull = errors.New("too many texts wait for this pane's next turn")

// enqueue stores a text for the next turn of the pane's session of that
// incarnation.
func (st *store) enqueue(ctx context.Context, paneID string, incarnation int64, text string) error {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	return pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		// Serialize a pane's enqueues so the bound holds.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", paneID); err != nil {
			return fmt.Errorf("queue text: %w", err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM queued_sends WHERE pane_id = $1", paneID).Scan(&n); err != nil {
			return fmt.Errorf("queue text: %w", err)
		}
		if n >= maxQueuedPerPane {
			return errQueueFull
		}
		if _, err := tx.Exec(ctx, "INSERT INTO queued_sends (pane_id, incarnation, body) VALUES ($1, $2, $3)", paneID, incarnation, text); err != nil {
			return fmt.Errorf("queue text: %w", err)
		}
		return nil
	})
}

// queued is one text waiting for a pane's next turn.
type queued struct {
	seq         int64
	paneID      string
	incarnation int64
	text        string
}

// nextQueued returns the oldest text waiting for each pane.
func (st *store) nextQueued(ctx context.Context) ([]queued, error) {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	rows, err := st.db.Query(ctx, `SELECT DISTINCT ON (pane_id) seq, pane_id, incarnation, body FROM queued_sends ORDER BY pane_id, seq`)
	if err != nil {
		return nil, fmt.Errorf("read queued texts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queued, error) {
		var q queued
		err := row.Scan(&q.seq, &q.paneID, &q.incarnation, &q.text)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("read queued texts: %w", err)
	}
	return out, nil
}

func (st *store) dequeue(ctx context.Context, seq int64) error {
	ctx, cancel := st.bound(ctx)
	defer cancel()
	if _, err := st.db.Exec(ctx, "DELETE FROM queued_sends WHERE seq = $1", seq); err != nil {
		return fmt.Errorf("dequeue text: %w", err)
	}
	return nil
}
