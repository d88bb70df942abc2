package launcher

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
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
func (s *startState) set(what string) {
	body := strconv.Itoa(os.Getpid()) + "\n" + strconv.FormatInt(s.since.Unix(), 10) + "\n" + what + "\n"
	if err := atomicfile.Replace(s.path, []byte(body), 0o600); err != nil {
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
