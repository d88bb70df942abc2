package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// agentServed reports whether the session service (a follower of the
// config) knows the agent alias: session/new fails for one it does not.
func agentServed(c *e2e.Client, alias string) error {
	_, err := c.Call("session/new", map[string]any{"agent_alias": alias})
	return err
}

// A config history restored into the same database (pg_restore of an
// older dump) and committed on again up to the revision number its
// followers held: the restored history has the same id and the same
// numbers, so the session service kept the document it had for that
// number (agent "old2", which the database no longer holds) and refused
// the restored history's agent "new2", for ever: its 30 s resync read
// the same number and took it for the one it had. Each revision now
// carries the digest of its stored content, compared on every read.
func TestRestoredConfigHistoryIsFollowed(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir, Env: []string{"DATABASE_URL=" + url, "CLAWMESH_LOG_LEVEL=debug"}})
	t.Cleanup(func() {
		// The config service's reads of its database, at debug level,
		// say why a restore was not followed.
		if raw, err := os.ReadFile(filepath.Join(dir, "logs", "config.log")); t.Failed() && err == nil {
			t.Logf("config.log:\n%s", raw[max(0, len(raw)-16<<10):])
		}
	})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	set := func(alias string) {
		t.Helper()
		call(t, c, "config/set", map[string]any{"prop": "agents." + alias + ".provider", "value": "scripted"})
	}
	set("kept")
	dump := filepath.Join(t.TempDir(), "config.dump")
	testenv.PGTool(t, "pg_dump", "--format=custom", "--schema=config", "--file="+dump, url)
	set("old1")
	set("old2")
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error { return agentServed(c, "old2") })

	testenv.PGTool(t, "pg_restore", "--clean", "--if-exists", "--single-transaction", "--schema=config", "--dbname="+url, dump)
	// The config service follows its database within its second: then
	// the restored history goes on, to the number the followers hold.
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		if _, err := c.Call("config/get", map[string]any{"prop": "agents.old1.provider"}); err == nil {
			return fmt.Errorf("the config service still serves agents.old1")
		}
		return nil
	})
	set("new1")
	set("new2")
	restored := time.Now()
	// Past the followers' 30 s resync: without the digest nothing ever
	// told them.
	testenv.Eventually(t, 35*time.Second, 50*time.Millisecond, func() error {
		if err := agentServed(c, "new2"); err != nil {
			return fmt.Errorf("the restored history's agent new2: %w", err)
		}
		if agentServed(c, "old2") == nil {
			return fmt.Errorf("agent old2, no longer in the database, still served")
		}
		return nil
	})
	t.Logf("the restored history followed %v after its commits", time.Since(restored).Round(time.Millisecond))
}

// A revision's stored document rewritten in place (an UPDATE by hand, a
// row put back from a backup) at the number everyone holds: the config
// service compared its database's newest revision number, token counts
// and history id, all unchanged, and served the old document until it
// restarted; its followers kept it even then. The rewrite is now read
// within the config service's second and followed by its consumers.
func TestRewrittenConfigRevisionIsFollowed(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	s := e2e.Start(t, e2e.Options{Env: []string{"DATABASE_URL=" + url}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	call(t, c, "config/set", map[string]any{"prop": "agents.before.provider", "value": "scripted"})
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error { return agentServed(c, "before") })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, `UPDATE config.revisions
		SET document = jsonb_set(document, '{agents}', '{"after": {"provider": "scripted"}}')
		WHERE revision = (SELECT max(revision) FROM config.revisions)`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("rewrite the newest revision: %v (%d rows)", err, tag.RowsAffected())
	}
	rewritten := time.Now()
	testenv.Eventually(t, 35*time.Second, 50*time.Millisecond, func() error {
		if _, err := c.Call("config/get", map[string]any{"prop": "agents.after.provider"}); err != nil {
			return fmt.Errorf("the config service: agents.after: %w", err)
		}
		if err := agentServed(c, "after"); err != nil {
			return fmt.Errorf("the session service: agent after: %w", err)
		}
		if agentServed(c, "before") == nil {
			return fmt.Errorf("the session service: agent before, no longer in the database, still served")
		}
		return nil
	})
	t.Logf("the rewritten revision followed %v after the rewrite", time.Since(rewritten).Round(time.Millisecond))
}
