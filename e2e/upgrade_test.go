package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/stack"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A start that upgrades the database says so on the terminal, after the
// "is up" line: which schema, from which migration to which, and that an
// older clawmesh can no longer open it. A data directory whose session
// schema lacks its newest migration (its row deleted and its column
// dropped, as a version before it left it) is one; a restart after it,
// and a first start, say nothing more than "is up". It was said only in
// the session service's log under <data>/logs.
// The session schema's newest migration undone, and the line its redo
// prints: a new migration there means a new undo here (the line names
// the two newest).
const (
	undoNewestSessionMigration = `DROP INDEX session.approvals_turn; ALTER TABLE session.approvals DROP COLUMN timeout_secs;
		DELETE FROM session.schema_migrations WHERE version = 18`
	newestSessionUpgrade = "database upgraded: session 0017_checkpoint_update_marks → 0018_approval_timeout (a clawmesh older than this one can no longer open it)"
)

func TestUpgradeIsToldOnTheTerminal(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	dir := e2e.TempDataDir(t)
	opts := e2e.Options{DataDir: dir, Env: []string{"DATABASE_URL=" + url}}
	const upgraded = "database upgraded"

	s := e2e.Start(t, opts)
	s.Stop()
	if out := s.Stdout(); strings.Contains(out, upgraded) || !strings.Contains(out, "is up") {
		t.Fatalf("a first start printed:\n%s", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, undoNewestSessionMigration); err != nil {
		t.Fatal(err)
	}

	s = e2e.Start(t, opts)
	s.Stop()
	out := s.Stdout()
	want := newestSessionUpgrade
	if !strings.Contains(out, want) {
		t.Fatalf("the start that upgraded the database printed:\n%s\nwant the line %q", out, want)
	}
	if strings.Count(out, upgraded) != 1 || strings.Index(out, want) < strings.Index(out, "is up") {
		t.Fatalf("the upgrade is not told once, after the stack is up:\n%s", out)
	}

	s = e2e.Start(t, opts)
	s.Stop()
	if out := s.Stdout(); strings.Contains(out, upgraded) {
		t.Fatalf("a restart after the upgrade printed:\n%s", out)
	}
}

// A start that fails before "is up" (here its gateway cannot run, after
// every service, the session service's migrations included, started and
// served) said nothing of the upgrade it made: the terminal showed the
// failure alone, and the operator who went back to an older clawmesh
// learnt of it from that one's refusal. It tells it once everything
// started has stopped.
func TestUpgradeIsToldWhenTheStartFails(t *testing.T) {
	t.Parallel()
	url := testenv.Postgres(t)
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir, Env: []string{"DATABASE_URL=" + url}})
	s.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, undoNewestSessionMigration); err != nil {
		t.Fatal(err)
	}

	// The real binaries, but a gateway that cannot run as configured.
	bin := t.TempDir()
	for _, p := range stack.Processes {
		if err := os.Symlink(filepath.Join(s.BinDir, p.Name), filepath.Join(bin, p.Name)); err != nil {
			t.Fatal(err)
		}
	}
	gateway := filepath.Join(bin, "gateway")
	if err := os.Remove(gateway); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gateway, []byte("#!/bin/sh\necho '{\"level\":\"error\",\"msg\":\"cannot run: a test'\"'\"'s gateway\"}'\nexit 78\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(s.BinDir, "clawmesh"), "up", "--config-dir", dir, "--bin-dir", bin)
	cmd.Env = append(os.Environ(), "ZEROCLAW_SOCKET=", "DATABASE_URL="+url)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "a test's gateway") {
		t.Fatalf("the start with a gateway that cannot run: %v\n%s", err, stderr.String())
	}
	want := newestSessionUpgrade
	if out := stdout.String(); strings.Count(out, "database upgraded") != 1 || !strings.Contains(out, want) || strings.Contains(out, "is up") {
		t.Fatalf("the failed start that upgraded the database printed:\n%s\nwant the line %q alone", out, want)
	}
}
