package session

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
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

// makeUnremovable makes path (a file) impossible for this process to
// remove, as a tool run by the agent might: the immutable attribute for
// root, a folder without write permission for anyone else. The returned
// function undoes it for every file under root, wherever path went.
func makeUnremovable(t *testing.T, path, root string) (undo func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		if err := os.Chmod(filepath.Dir(path), 0o500); err != nil {
			t.Fatal(err)
		}
		undo = func() {
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					_ = os.Chmod(p, 0o700)
				}
				return nil
			})
		}
	} else {
		if out, err := exec.Command("chattr", "+i", path).CombinedOutput(); err != nil {
			t.Skipf("cannot make a file unremovable here: chattr: %v %s", err, out)
		}
		undo = func() { _ = exec.Command("chattr", "-R", "-i", root).Run() }
	}
	t.Cleanup(undo)
	if err := os.Remove(path); err == nil {
		t.Skip("the file could still be removed")
	}
	return undo
}

// Delete removed a session's workspace where it was; when the removal
// failed (a file the agent made unremovable) the folder stayed under the
// id, and a new session given the id, by anyone, found the deleted
// session's files. The folder now leaves the id's name first; what could
// not be removed goes at a later start.
func TestDeletedWorkspaceThatCannotBeRemovedIsNotTheNextSessions(t *testing.T) {
	h, pol := fileHarness(t)
	pol.grant(bob, useDefault)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	f := h.mustStore(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "secret.txt", Data: []byte("alice's")})
	undo := makeUnremovable(t, f.GetWorkspacePath(), h.dataDir)
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	resp, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: id, AgentAlias: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(resp.GetWorkspaceDir()); err != nil || len(entries) != 0 {
		t.Fatalf("bob's new session under alice's deleted id holds %v (%v)", entries, err)
	}
	discarded := filepath.Join(h.dataDir, "workspaces", discardedDir)
	if entries, err := os.ReadDir(discarded); err != nil || len(entries) != 1 {
		t.Fatalf("the workspace that could not be removed: %v %v", entries, err)
	}

	// Still unremovable at the next start: logged and left.
	h.restart()
	<-h.srv.emptied
	if entries, err := os.ReadDir(discarded); err != nil || len(entries) != 1 {
		t.Fatalf("after a start that could not remove it: %v %v", entries, err)
	}
	// Removable again: gone after the next start.
	undo()
	h.restart()
	<-h.srv.emptied
	if entries, err := os.ReadDir(discarded); err != nil || len(entries) != 0 {
		t.Fatalf("after a start that could remove it: %v %v", entries, err)
	}
}

// The workspaces a start moves aside are removed while the service
// serves: a removal that takes long (a large workspace, a slow disk) no
// longer holds the start back, and the ids are free at once.
func TestDiscardedWorkspacesRemovedWhileServing(t *testing.T) {
	release := make(chan struct{})
	var slow atomic.Bool
	h := newHarness(t, func(c *Config) {
		c.removeAll = func(path string) error {
			if slow.Load() {
				<-release
			}
			return os.RemoveAll(path)
		}
	})
	ctx := context.Background()
	id := h.newSession(alice, "default")
	if err := os.WriteFile(filepath.Join(h.dataDir, "workspaces", id, "left"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, "DELETE FROM sessions WHERE session_id = $1", id); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	h.restart() // returns while the removal waits
	resp, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id, AgentAlias: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(resp.GetWorkspaceDir()); err != nil || len(entries) != 0 {
		t.Fatalf("a new session under the id while its old workspace is removed: %v %v", entries, err)
	}
	select {
	case <-h.srv.emptied:
		t.Fatal("the removal ended while it was held")
	default:
	}
	close(release)
	<-h.srv.emptied
	if entries, err := os.ReadDir(filepath.Join(h.dataDir, "workspaces", discardedDir)); err != nil || len(entries) != 0 {
		t.Fatalf("discarded workspaces once the removal ran: %v %v", entries, err)
	}
}
