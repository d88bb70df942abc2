package launcher

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
)

// startState says, in the data directory (datadir.Starting), what the
// start waits for: the gateway, which answers status, starts last, so a
// start waiting for PostgreSQL (a new cluster's initdb, a slow disk, a
// server stopped) showed to `clawmesh status` as no stack at all, with
// the advice to start one, which the lock then refused. The file holds
// "<pid>\n<start, unix seconds>\n<what it waits for>\n".
type startState struct {
	path  string
	since time.Time
	log   *zap.Logger
}

func newStartState(dir string, log *zap.Logger) *startState {
	return &startState{path: datadir.Starting(dir), since: time.Now(), log: log}
}

// set says the start now waits for what. Not written is logged, not
// fatal: it only informs clients.
//
// Written to a file beside it and renamed into place, so a reader sees
// one whole state, but not synced: seven states of a start synced (the
// file and its folder, atomicfile's way) put fourteen fsyncs on the
// start's path, for a file nobody needs after a crash (a dead pid's is
// ignored, the next start writes its own).
func (s *startState) set(what string) {
	body := strconv.Itoa(os.Getpid()) + "\n" + strconv.FormatInt(s.since.Unix(), 10) + "\n" + what + "\n"
	tmp := s.path + ".tmp"
	err := os.WriteFile(tmp, []byte(body), 0o600)
	if err == nil {
		err = os.Rename(tmp, s.path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		s.log.Warn("start state not written", zap.String("file", s.path), zap.Error(err))
	}
}

// setf is set with a format.
func (s *startState) setf(format string, args ...any) { s.set(fmt.Sprintf(format, args...)) }

// done removes the file: the stack is up, or the start ended.
func (s *startState) done() {
	if err := os.Remove(s.path); err != nil && !os.IsNotExist(err) {
		s.log.Warn("start state not removed", zap.String("file", s.path), zap.Error(err))
	}
}
