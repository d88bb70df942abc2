package session

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A session whose rows were deleted while its workspace stayed (its
// process killed between the two) left every file stored in it, and a
// new session given the same id, by anyone, found them there. A process
// removes such folders as it starts; a live session's folder, a name no
// session could have, a file and a link (and the link's target) stay.
func TestWorkspacesOfDeletedSessionsRemovedAtStart(t *testing.T) {
	h, pol := fileHarness(t)
	pol.grant(bob, useDefault)
	ctx := context.Background()
	root := filepath.Join(h.dataDir, "workspaces")
	live := h.newSession(alice, "default")
	kept := h.mustStore(&sessionv1.StoreFileRequest{Principal: alice, SessionId: live, Filename: "a.txt", Data: []byte("alice's")})
	gone := h.newSession(alice, "default")
	left := h.mustStore(&sessionv1.StoreFileRequest{Principal: alice, SessionId: gone, Filename: "secret.txt", Data: []byte("the deleted session's")})
	// The rows deleted as Delete does, the folder left.
	if _, err := h.pool.Exec(ctx, "DELETE FROM sessions WHERE session_id = $1", gone); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "theirs"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		os.Mkdir(filepath.Join(root, "not an id"), 0o700),
		os.WriteFile(filepath.Join(root, "sess_afile"), nil, 0o600),
		os.Symlink(outside, filepath.Join(root, "sess_alink")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}

	h.restart()
	if _, err := os.Stat(left.GetWorkspacePath()); !os.IsNotExist(err) {
		t.Fatalf("the deleted session's file after a restart: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, gone)); !os.IsNotExist(err) {
		t.Fatalf("the deleted session's workspace after a restart: %v", err)
	}
	for _, path := range []string{kept.GetWorkspacePath(), filepath.Join(root, "not an id"), filepath.Join(root, "sess_afile"),
		filepath.Join(root, "sess_alink"), filepath.Join(outside, "theirs")} {
		if _, err := os.Lstat(path); err != nil {
			t.Fatalf("removed: %v", err)
		}
	}

	// Bob's new session under the deleted one's id starts empty.
	resp, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: gone, AgentAlias: "default"})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(resp.GetWorkspaceDir())
	if err != nil || len(entries) != 0 {
		t.Fatalf("a new session under a deleted one's id: %v %v", entries, err)
	}
}
