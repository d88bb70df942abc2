package launcher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
)

// A data directory removed while the stack runs (rm -rf, a cleaner of
// /tmp, a folder made again on the same path) takes with it what the
// stack cannot do without and cannot make again as it was: the client
// socket's path (no client connects any more), the lock (a second
// clawmesh up started beside this one), the bus seeds and the config
// key a restarted process reads (a new key would leave every secret
// sealed with the old one unreadable), the workspaces, and the private
// PostgreSQL cluster of a user other than root (its server writing into
// files gone, whose writes are lost at its stop). Nothing recreated
// would recover it: a fresh cluster and key would be an empty stack
// under the old name, with the clients none the wiser. So the launcher
// stops the stack and says why and what to do; before, it ran on, with
// no client able to reach it, doctor saying "no stack runs on this data
// directory", and the clawmesh up it advised starting a second stack
// beside it.

// dataDirPoll is how often the launcher looks at its data directory: a
// stat, nothing read.
const dataDirPoll = time.Second

// watchDataDir stops the stack (stop, with ErrDataDirRemoved) once dir is
// no longer the folder the stack started on (was, its stat at start):
// gone, another folder in its place, or its lock file (locked, the file
// the launcher holds) gone or another. The lock file tells a folder made
// again whose inode number is the removed one's (a file system reuses a
// freed number at once): the lock file's cannot be, since the launcher
// holds it open. It returns when ctx ends.
func watchDataDir(ctx context.Context, dir string, was, locked fs.FileInfo, poll time.Duration, stop context.CancelCauseFunc, log *zap.Logger) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		what := ""
		switch fi, err := os.Stat(dir); {
		case errors.Is(err, fs.ErrNotExist):
			what = "it is gone"
		case err != nil:
			// Unreadable is not gone: the stack's own use of it says
			// the rest (a disk gone, a permission changed).
			continue
		case !os.SameFile(fi, was):
			what = "another folder is in its place"
		default:
			lf, err := os.Stat(datadir.LockFile(dir))
			switch {
			case errors.Is(err, fs.ErrNotExist), err == nil && !os.SameFile(lf, locked):
				what = "its lock file is gone: the folder was emptied or made again"
			default:
				continue
			}
		}
		log.Error("data directory removed while the stack runs, stopping", zap.String("data_dir", dir), zap.String("found", what))
		stop(fmt.Errorf("%w: %s (%s): its sockets, lock, bus seeds, config key, workspaces and logs went with it, and its database too unless DATABASE_URL or root's cluster keeps it elsewhere; the stack stopped. Start it again with `clawmesh up --config-dir %s`, on the folder restored from a backup if you keep one",
			ErrDataDirRemoved, dir, what, dir))
		return
	}
}
