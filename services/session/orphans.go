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
// Delete removes the rows, then the folder. A process that died between
// the two, or a removal that failed (a folder the agent made unwritable),
// left the folder with every file stored in it for good, named by an id
// no row holds any more, and a new session given the same id (a client
// may choose it) would have found those files in its workspace. Each
// process removes such folders as it starts, before it serves: no
// session can be made or deleted meanwhile.

// orphanBatch is how many folders one query checks.
const orphanBatch = 512

// removeOrphanWorkspaces removes the folders under workspaces named as a
// session id is that no session row names, and returns their names.
// Anything else there is left.
func (s *Server) removeOrphanWorkspaces(ctx context.Context) (removed []string, err error) {
	root := filepath.Join(s.cfg.DataDir, "workspaces")
	dir, err := os.Open(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
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
				return removed, qerr
			}
			for _, id := range gone {
				if rerr := os.RemoveAll(filepath.Join(root, id)); rerr != nil {
					return removed, fmt.Errorf("remove workspace %s: %w", id, rerr)
				}
				removed = append(removed, id)
			}
		}
		if errors.Is(err, io.EOF) {
			return removed, nil
		}
		if err != nil {
			return removed, err
		}
	}
}

// clearOrphans runs removeOrphanWorkspaces and logs what it did. A
// failure does not stop the start: the next process tries again.
func (s *Server) clearOrphans(ctx context.Context) {
	removed, err := s.removeOrphanWorkspaces(ctx)
	for _, id := range removed {
		s.log.Info("workspace of a deleted session removed", zap.String("session_id", id))
	}
	if err != nil {
		s.log.Warn("workspaces of deleted sessions not cleared", zap.Error(err))
	}
}
