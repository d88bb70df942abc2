package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/ids"
)

// A session's workspace (<data>/workspaces/<id>) goes with its rows:
// Delete removes the rows, then the folder. The id is free from then on
// and a new session given it (a client may choose it, whoever they are)
// must not find the deleted session's files. So the folder first leaves
// the id's name, by a rename into the discarded folder (one system call,
// whatever the folder holds), and only then is removed. A removal that
// fails (a file the agent's tools made unremovable, a disk error) leaves
// it there, under a name no session has, for the next process to try.
//
// A process killed between the rows and the rename left the folder under
// the id: each process moves such folders aside as it starts, before it
// serves, so no session can be made or deleted meanwhile. The discarded
// folder is emptied afterwards, while the service serves, so a large
// leftover does not hold the start back.

// discardedDir is the folder under workspaces that workspaces leave
// their id's name for. Its name (a dot) is no session id's.
const discardedDir = ".discarded"

// orphanBatch is how many folders one query checks.
const orphanBatch = 512

func (s *Server) workspacesRoot() string { return filepath.Join(s.cfg.DataDir, "workspaces") }

// discardWorkspace moves the workspace of session id into the discarded
// folder and returns where it went; "" when the session had none.
func (s *Server) discardWorkspace(id string) (string, error) {
	root := s.workspacesRoot()
	aside := filepath.Join(root, discardedDir)
	if err := os.Mkdir(aside, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil // no workspaces folder, so no workspace
		}
		return "", fmt.Errorf("discard workspace %s: %w", id, err)
	}
	to := filepath.Join(aside, ids.New("ws_"))
	if err := os.Rename(filepath.Join(root, id), to); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("discard workspace %s: %w", id, err)
	}
	return to, nil
}

// removeWorkspace is Delete's end: the workspace of id leaves the id's
// name, then is removed.
func (s *Server) removeWorkspace(id string) error {
	aside, err := s.discardWorkspace(id)
	if err != nil || aside == "" {
		return err
	}
	if err := s.cfg.removeAll(aside); err != nil {
		return fmt.Errorf("remove workspace %s (left in %s for the next start): %w", id, discardedDir, err)
	}
	return nil
}

// discardOrphanWorkspaces moves aside the folders under workspaces named
// as a session id is that no session row names, and returns their names.
// Anything else there is left. A folder that cannot be moved does not
// stop the others'.
func (s *Server) discardOrphanWorkspaces(ctx context.Context) (moved []string, err error) {
	dir, err := os.Open(s.workspacesRoot())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var failed error
	for {
		entries, err := dir.ReadDir(orphanBatch)
		var names []string
		for _, e := range entries {
			if e.IsDir() && ids.Token(e.Name()) {
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			gone, qerr := s.store.missingSessions(ctx, names)
			if qerr != nil {
				return moved, errors.Join(failed, qerr)
			}
			for _, id := range gone {
				if _, derr := s.discardWorkspace(id); derr != nil {
					// The first error says why; a folder left is tried
					// again at the next start.
					if failed == nil {
						failed = derr
					}
					continue
				}
				moved = append(moved, id)
			}
		}
		if errors.Is(err, io.EOF) {
			return moved, failed
		}
		if err != nil {
			return moved, errors.Join(failed, err)
		}
	}
}

// clearOrphans runs discardOrphanWorkspaces and logs what it did. A
// failure does not stop the start: the next process tries again.
func (s *Server) clearOrphans(ctx context.Context) {
	moved, err := s.discardOrphanWorkspaces(ctx)
	for _, id := range moved {
		s.log.Info("workspace of a deleted session discarded", zap.String("session_id", id))
	}
	if err != nil {
		s.log.Warn("workspaces of deleted sessions not all discarded", zap.Error(err))
	}
}

// emptyDiscarded removes what the discarded folder holds, one workspace
// at a time, until it is empty or stop is closed. A workspace that cannot
// be removed is logged and left for the next process.
func (s *Server) emptyDiscarded(stop <-chan struct{}) {
	aside := filepath.Join(s.workspacesRoot(), discardedDir)
	dir, err := os.Open(aside)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		s.log.Warn("discarded workspaces not removed", zap.Error(err))
		return
	}
	defer dir.Close()
	removed, left := 0, 0
	defer func() {
		if removed+left > 0 {
			s.log.Info("discarded workspaces removed", zap.Int("removed", removed), zap.Int("left", left))
		}
	}()
	for {
		entries, err := dir.ReadDir(orphanBatch)
		for _, e := range entries {
			select {
			case <-stop:
				return
			default:
			}
			if rerr := s.cfg.removeAll(filepath.Join(aside, e.Name())); rerr != nil {
				left++
				s.log.Warn("discarded workspace not removed", zap.String("path", filepath.Join(aside, e.Name())), zap.Error(rerr))
				continue
			}
			removed++
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.log.Warn("discarded workspaces not all read", zap.Error(err))
			}
			return
		}
	}
}
