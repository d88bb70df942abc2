package config

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	"github.com/clawmesh/clawmesh/services/config/migrations"
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

// A commit's audit row keeps the peer's uid as the kernel gave it, an
// unsigned 32-bit value: peer_uid was an integer, so uid 4294967294
// (carried as the int32 -2 on gRPC) was stored as -2. The gateway's "no
// credentials" (-1) is no uid and is stored as none.
func TestAuditStoresUnsignedPeerUID(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		uid  uint32
		want *int64
	}{{4294967294, ptr(int64(4294967294))}, {3000000000, ptr(int64(3000000000))}, {1000, ptr(int64(1000))}, {4294967295, nil}} {
		pr := &commonv1.Principal{PrincipalId: OperatorPrincipal, Operator: true, PeerUid: int32(c.uid), PeerPid: 42}
		resp, err := e.setMany(pr, kv{"agents.default.system_prompt", fmt.Sprintf("by %d", c.uid)})
		if err != nil {
			t.Fatalf("commit by uid %d: %v", c.uid, err)
		}
		var got *int64
		if err := e.opts.DB.QueryRow(ctxFor(t), "SELECT peer_uid FROM revisions WHERE revision = $1", resp.GetRevision()).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("uid %d stored as %v", c.uid, deref(got))
		}
	}
}

func ptr[T any](v T) *T { return &v }

func deref(p *int64) any {
	if p == nil {
		return "NULL"
	}
	return *p
}

// The migration unwraps the uids already stored: a database with rows
// written before it keeps each commit's real uid.
func TestMigrationUnwrapsStoredPeerUIDs(t *testing.T) {
	ctx := ctxFor(t)
	url := testenv.Postgres(t)
	before := fstest.MapFS{}
	for _, name := range []string{"0001_init.sql", "0002_audit_tokens.sql", "0003_bounded_history.sql"} {
		b, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		before[name] = &fstest.MapFile{Data: b}
	}
	old, err := pg.Open(ctx, url, "config", before, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for i, uid := range []any{int32(-2), int32(-1294967296), int32(-1), int32(1000), nil} {
		if _, err := old.Exec(ctx, "INSERT INTO revisions (revision, document, committed_by, peer_uid) VALUES ($1, '{}', 'x', $2)", i+1, uid); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()
	db, err := pg.Open(ctx, url, "config", migrations.FS, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var got []string
	rows, err := db.Query(ctx, "SELECT coalesce(peer_uid::text, 'NULL') FROM revisions ORDER BY revision")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := "4294967294 3000000000 NULL 1000 NULL"; strings.Join(got, " ") != want {
		t.Fatalf("peer uids after the migration: %v, want %s", got, want)
	}
}
