package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
)

// The gateway sees a process only through its socket: one the launcher
// is restarting after a crash read "unreachable" with the dial's error,
// and one stopped (SIGSTOP, a hung process) "unreachable: context
// deadline exceeded", while the launcher knew the attempt, the exit and
// the silence. It says them in the data directory (datadir.Processes),
// written on each change of a process's state alone (an exit, a run
// started, a first answer, a silence begun or ended): never on a probe
// that changes nothing, so a running stack writes nothing.

// ProcessStates is the file's content.
type ProcessStates struct {
	// LauncherPID is the writer: a file whose launcher is gone (killed
	// outright) says nothing.
	LauncherPID int `json:"launcher_pid"`
	// ProbeEvery is the longest a health check is waited for; Liveness
	// the silence after which a process is killed (0: never).
	ProbeEvery time.Duration `json:"probe_every"`
	Liveness   time.Duration `json:"liveness"`
	// Processes by process name (a replica's is "plugin-sandbox.1").
	Processes map[string]ProcessState `json:"processes"`
}

// ProcessState is what the launcher knows of one process.
type ProcessState struct {
	// PID of the current run; 0 while none runs (a restart's backoff).
	PID int `json:"pid,omitempty"`
	// Restarts made or under way (the attempt); LastExit how the last
	// run ended ("exit status 1", "signal: killed") and ExitedAt when.
	Restarts int       `json:"restarts,omitempty"`
	LastExit string    `json:"last_exit,omitempty"`
	ExitedAt time.Time `json:"exited_at,omitzero"`
	// RestartAt is when the next run starts, while none runs.
	RestartAt time.Time `json:"restart_at,omitzero"`
	// StartedAt is when the current run started; Answered whether it
	// has answered a health check since (known only with liveness
	// probing on).
	StartedAt time.Time `json:"started_at,omitzero"`
	Answered  bool      `json:"answered,omitempty"`
	// SilentSince is the run's last answer, set while it answers no
	// more (a stopped or hung process).
	SilentSince time.Time `json:"silent_since,omitzero"`
}

// maxStatesFile bounds what ReadProcessStates reads: a few hundred bytes
// per process, of at most some seventy.
const maxStatesFile = 1 << 20

// ErrNoLauncher: no launcher supervises a stack on the data directory
// (no file, or its launcher gone).
var ErrNoLauncher = errors.New("no launcher's process states")

// ReadProcessStates reads the launcher's process states of the data
// directory dir. The file is opened without following a symbolic link:
// it lives in the owner's private data directory, and a link there is
// not the launcher's.
func ReadProcessStates(dir string) (ProcessStates, error) {
	var st ProcessStates
	f, err := os.OpenFile(datadir.Processes(dir), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return st, ErrNoLauncher
	}
	if err != nil {
		return st, fmt.Errorf("process states: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxStatesFile+1))
	if err != nil {
		return st, fmt.Errorf("process states: %w", err)
	}
	if len(raw) > maxStatesFile {
		return st, fmt.Errorf("process states: %s is larger than %d bytes", datadir.Processes(dir), maxStatesFile)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("process states: %w", err)
	}
	if st.LauncherPID <= 0 {
		return st, ErrNoLauncher
	}
	if err := syscall.Kill(st.LauncherPID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return st, ErrNoLauncher
	}
	return st, nil
}

// procStates writes the file. A nil *procStates writes nothing (tests
// of the supervisor alone).
type procStates struct {
	path string
	log  *zap.Logger

	mu  sync.Mutex
	st  ProcessStates
	bad bool // a write failed: said once
}

func newProcStates(dir string, probeEvery, liveness time.Duration, log *zap.Logger) *procStates {
	return &procStates{path: datadir.Processes(dir), log: log, st: ProcessStates{
		LauncherPID: os.Getpid(), ProbeEvery: probeEvery, Liveness: liveness, Processes: map[string]ProcessState{},
	}}
}

// change applies f to name's state and writes the file.
func (s *procStates) change(name string, f func(*ProcessState)) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.st.Processes[name]
	f(&ps)
	s.st.Processes[name] = ps
	s.writeLocked()
}

// writeLocked replaces the file, renamed into place so a reader sees a
// whole one; not synced, as the start state is not (starting.go): after
// a crash its launcher pid is gone and it is ignored.
func (s *procStates) writeLocked() {
	raw, err := json.Marshal(s.st)
	if err == nil {
		tmp := s.path + ".tmp"
		if err = os.WriteFile(tmp, raw, 0o600); err == nil {
			err = os.Rename(tmp, s.path)
		}
		if err != nil {
			_ = os.Remove(tmp)
		}
	}
	if err != nil && !s.bad {
		s.bad = true
		s.log.Warn("process states not written: clawmesh status shows what the gateway sees alone", zap.String("file", s.path), zap.Error(err))
	}
}

func (s *procStates) started(name string, pid int) {
	s.change(name, func(ps *ProcessState) {
		ps.PID, ps.StartedAt, ps.Answered = pid, time.Now(), false
		ps.RestartAt, ps.SilentSince = time.Time{}, time.Time{}
	})
}

func (s *procStates) exited(name string, restarts int, how string, next time.Duration) {
	s.change(name, func(ps *ProcessState) {
		now := time.Now()
		ps.PID, ps.Restarts, ps.LastExit, ps.ExitedAt = 0, restarts, how, now
		ps.RestartAt, ps.Answered, ps.SilentSince = now.Add(next), false, time.Time{}
	})
}

// answered records a probe's outcome for the run pid, writing only when
// it changes what the file says. Checked and changed under one lock: a
// run that exits meanwhile (exited) is not marked answered.
func (s *procStates) answered(name string, pid int, answered bool, last time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ps, ok := s.st.Processes[name]
	if !ok || ps.PID != pid {
		return
	}
	switch {
	case answered && (!ps.Answered || !ps.SilentSince.IsZero()):
		ps.Answered, ps.SilentSince = true, time.Time{}
	case !answered && !last.IsZero() && ps.SilentSince.IsZero():
		ps.SilentSince = last
	default:
		return
	}
	s.st.Processes[name] = ps
	s.writeLocked()
}

// remove deletes the file: the launcher stops supervising.
func (s *procStates) remove() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("process states not removed", zap.String("file", s.path), zap.Error(err))
	}
}
