package config

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/configschema"
)

// ErrKeyMismatch: the data directory's secret key does not open the
// secrets stored in the database (the database belongs to another data
// directory, or the key was replaced). Nothing repairs it by retrying.
var ErrKeyMismatch = errors.New("secret key does not match the stored config")

// load reads the newest revision (decrypting its secrets) and the paired
// tokens.
func (s *Server) load(ctx context.Context) (*snapshot, error) {
	var (
		revision int64
		raw      []byte
	)
	stored := map[string]any{}
	var history string
	if err := s.db.QueryRow(ctx, "SELECT coalesce(max(id), '') FROM history").Scan(&history); err != nil {
		return nil, fmt.Errorf("load config history id: %w", err)
	}
	var digest string
	err := s.db.QueryRow(ctx, "SELECT revision, document, "+docDigest+" FROM revisions ORDER BY revision DESC LIMIT 1").Scan(&revision, &raw, &digest)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("load config: %w", err)
	default:
		if err := json.Unmarshal(raw, &stored); err != nil {
			return nil, fmt.Errorf("decode stored config revision %d: %w", revision, err)
		}
		if stored, err = s.sealer.open(stored); err != nil {
			if errors.Is(err, ErrKeyMismatch) {
				cc := s.db.Config().ConnConfig
				return nil, fmt.Errorf("the key %s does not open the secrets of config revision %d in the database %q at %s: "+
					"the database belongs to another data directory, or the key was replaced; restore the key that sealed them, "+
					"or start on a fresh database: %w", s.keyFile, revision, cc.Database, cc.Host, err)
			}
			return nil, fmt.Errorf("stored config revision %d: %w", revision, err)
		}
		if stored, err = configschema.Normalize(stored); err != nil {
			return nil, fmt.Errorf("stored config revision %d does not fit the schema: %w", revision, err)
		}
	}
	tokens := map[string]string{}
	rows, err := s.db.Query(ctx, "SELECT token_hash, username FROM tokens WHERE revoked_at IS NULL")
	if err != nil {
		return nil, fmt.Errorf("load tokens: %w", err)
	}
	for rows.Next() {
		var hash, user string
		if err := rows.Scan(&hash, &user); err != nil {
			rows.Close()
			return nil, fmt.Errorf("load tokens: %w", err)
		}
		tokens[hash] = user
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load tokens: %w", err)
	}
	return newSnapshot(revision, history, digest, stored, tokens), nil
}

// docDigest is the SQL of a revision row's digest: the SHA-256 of its
// document as the database holds it (jsonb's own text, not the bytes a
// commit sent), so a commit's snapshot and a later load of the same row
// agree, and a row put back by pg_restore or rewritten by hand does not
// (its sealed secrets included).
const docDigest = "encode(sha256(convert_to(document::text, 'UTF8')), 'hex')"

// audit is who a commit is by.
type audit struct {
	by string
	// peerUID is the uid as the kernel gives it, unsigned (the int32 on
	// gRPC wraps past 2^31-1); nil when there is none.
	peerUID *int64
	peerPID *int32
}

// KeepDocuments is how many of the newest revisions keep their full
// document. Older revisions keep their audit row (revision, time, author,
// peer, props) and lose the document, so the history stays bounded:
// 2,000 commits of a large config no longer hold 2,000 documents.
const KeepDocuments = 100

// insertRevision stores a candidate as revision rev inside tx, secrets
// encrypted, and drops the documents that fell out of the newest
// KeepDocuments. Revision 1 begins a history: history, when not empty, is
// its new id (newHistory), stored with it. It returns the row's digest
// (docDigest).
func (s *Server) insertRevision(ctx context.Context, tx pgx.Tx, rev int64, history string, stored map[string]any, who audit, props []string) (string, error) {
	sealed, err := s.sealer.seal(stored)
	if err != nil {
		return "", fmt.Errorf("encrypt secrets: %w", err)
	}
	doc, err := json.Marshal(sealed)
	if err != nil {
		return "", fmt.Errorf("encode config: %w", err)
	}
	var digest string
	err = tx.QueryRow(ctx, "INSERT INTO revisions (revision, document, committed_by, props, peer_uid, peer_pid) VALUES ($1, $2, $3, $4, $5, $6) "+
		"RETURNING "+docDigest, rev, doc, who.by, props, who.peerUID, who.peerPID).Scan(&digest)
	if err != nil {
		return "", fmt.Errorf("insert revision %d: %w", rev, err)
	}
	if _, err := tx.Exec(ctx, "UPDATE revisions SET document = NULL WHERE document IS NOT NULL AND revision <= $1",
		rev-KeepDocuments); err != nil {
		return "", fmt.Errorf("prune revision documents: %w", err)
	}
	if history != "" {
		// Revisions emptied under a running history (a reset by hand)
		// begin a new one here: its numbers meet the old ones again.
		if _, err := tx.Exec(ctx, "DELETE FROM history"); err != nil {
			return "", fmt.Errorf("replace the history id: %w", err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO history (id) VALUES ($1)", history); err != nil {
			return "", fmt.Errorf("replace the history id: %w", err)
		}
	}
	return digest, nil
}

// newHistory is the id of a history beginning at revision rev: a new
// random one for revision 1, else none (the history goes on).
func newHistory(rev int64) (string, error) {
	if rev != 1 {
		return "", nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("history id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// storedRevision is the newest revision in the database, read on a fresh
// connection: after a failed COMMIT it tells whether the commit happened.
func (s *Server) storedRevision(ctx context.Context) (int64, error) {
	var rev int64
	err := s.db.QueryRow(ctx, "SELECT coalesce(max(revision), 0) FROM revisions").Scan(&rev)
	return rev, err
}
