package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// History is bounded: past KeepDocuments commits the older documents are
// dropped, every audit row stays, and the newest document is the config.
func TestHistoryKeepsAuditDropsOldDocuments(t *testing.T) {
	e := newEnv(t, nil)
	const commits = KeepDocuments + 30
	var last int64
	for i := range commits {
		last = e.mustSet(kv{"agents.default.system_prompt", fmt.Sprintf("prompt %d", i)})
	}
	ctx := ctxFor(t)
	var rows, withDoc, withAudit, oldestDoc int64
	err := e.opts.DB.QueryRow(ctx, `SELECT count(*), count(document), count(*) FILTER (WHERE committed_by <> '' AND cardinality(props) > 0),
		coalesce(min(revision) FILTER (WHERE document IS NOT NULL), 0) FROM revisions`).Scan(&rows, &withDoc, &withAudit, &oldestDoc)
	if err != nil {
		t.Fatal(err)
	}
	if rows != commits || withAudit != commits {
		t.Fatalf("%d revisions with %d audit rows, want %d of each", rows, withAudit, commits)
	}
	if withDoc != KeepDocuments || oldestDoc != last-KeepDocuments+1 {
		t.Fatalf("%d documents kept from revision %d, want %d from %d", withDoc, oldestDoc, KeepDocuments, last-KeepDocuments+1)
	}
	// A restart reads the newest document.
	srv, err := New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	if snap := srv.current(); snap.revision != last || snap.stored["agents"].(map[string]any)["default"].(map[string]any)["system_prompt"] != fmt.Sprintf("prompt %d", commits-1) {
		t.Fatalf("reloaded revision %d: %v", snap.revision, snap.stored)
	}
}

// A data directory whose key does not open the database's secrets (the
// database was another data directory's) fails the start with an error
// naming both the key file and the database, as ErrKeyMismatch.
func TestKeyMismatchNamesBothPaths(t *testing.T) {
	e := newEnv(t, nil)
	e.mustSet(kv{"agents.default.api_key", "sk-sealed-by-the-first-key"})
	other := e.opts
	other.DataDir = t.TempDir()
	_, err := New(ctxFor(t), other)
	if !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("another key: %v", err)
	}
	cc := e.opts.DB.Config().ConnConfig
	for _, want := range []string{filepath.Join(other.DataDir, KeyFileName), cc.Host, cc.Database} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
}
