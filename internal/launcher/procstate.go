package launcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/procstat"
)

// The gateway sees a process only through its socket: one the launcher
// is restarting after a crash read "unreachable" with the dial's error,
// and one stopped (SIGSTOP, a hung process) "unreachable: context
// deadline exceeded", while the launcher knew the attempt, the exit and
// the silence. It says them in the data directory (datadir.Processes),
// written on each change of a process's state alone (an exit, a run
// started, a first answer, a silence begun or ended): never on a probe
// that changes nothing, so a running stack writes nothing. The same file
// says, while the stack starts, what the start waits for (the gateway,
// which answers status, starts last).

// ProcessStates is the file's content.
type ProcessStates struct {
	// LauncherPID is the writer: a file whose launcher is gone (killed
	// outright) says nothing. LauncherStart is when that process started
	// (clock ticks since boot, /proc/<pid>/stat): the file is synced, so
	// it outlives a crash of the machine, and after the reboot its pid
	// may be another process's.
	LauncherPID   int    `json:"launcher_pid"`
	LauncherStart uint64 `json:"launcher_start,omitempty"`
	// Starting is what the start waits for, from the lock taken until the
	// stack is up; nil after. It was a file of its own, clawmesh.starting
	// (datadir.Starting), written beside this one.
	Starting *StartState `json:"starting,omitempty"`
	// ProbeEvery is the longest a health check is waited for; Liveness
	// the silence after which a process is killed (0: never).
	ProbeEvery time.Duration `json:"probe_every"`
	Liveness   time.Duration `json:"liveness"`
	// Processes by process name (a replica's is "plugin-sandbox.1").
	Processes map[string]ProcessState `json:"processes"`
}

// StartState is what a start waits for, and since when it runs.
type StartState struct {
	Since    time.Time `json:"since"`
	WaitsFor string    `json:"waits_for"`
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

// ErrStatesRefused: the file is there but is not one the launcher wrote
// whole (a link, a FIFO, cut, garbage, too large). It was read as no
// launcher at all, and a FIFO hung its reader.
var ErrStatesRefused = errors.New("refused")

// ReadProcessStates reads the launcher's process states of the data
// directory dir. The file lives in the owner's private data directory,
// and anything there but a regular file of at most maxStatesFile bytes
// holding one JSON object is refused (ErrStatesRefused), named: opened
// without following a link and without blocking (a FIFO), judged by what
// was opened.
func ReadProcessStates(dir string) (ProcessStates, error) {
	var st ProcessStates
	path := datadir.Processes(dir)
	raw, err := readStateFile(path, maxStatesFile)
	if errors.Is(err, fs.ErrNotExist) {
		return st, ErrNoLauncher
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("launcher state %s %w: %w", path, ErrStatesRefused, err)
	}
	if !launcherLives(st.LauncherPID, st.LauncherStart) {
		return st, ErrNoLauncher
	}
	return st, nil
}

// launcherLives reports whether the process pid runs and, when start is
// known, is the one that started then (not a later one given its pid).
func launcherLives(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if start == 0 {
		return true
	}
	ps, err := procstat.Read(pid)
	return err != nil || ps.Start == 0 || ps.Start == start
}

// readStateFile reads path, a launcher's state file, refusing anything
// but a regular file of at most max bytes (ErrStatesRefused, the path
// named); a missing file is fs.ErrNotExist.
func readStateFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("launcher state %s %w: a symbolic link, not the launcher's file", path, ErrStatesRefused)
	}
	if err != nil {
		return nil, fmt.Errorf("launcher state %s %w: %w", path, ErrStatesRefused, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("launcher state %s %w: %w", path, ErrStatesRefused, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("launcher state %s %w: not a regular file (%s)", path, ErrStatesRefused, fi.Mode().Type())
	}
	raw, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("launcher state %s %w: %w", path, ErrStatesRefused, err)
	}
	if int64(len(raw)) > max {
		return nil, fmt.Errorf("launcher state %s %w: larger than %d bytes", path, ErrStatesRefused, max)
	}
	return raw, nil
}

// maxOldStart bounds the start state of a launcher from before the two
// files were one: a pid, a time and one line.
const maxOldStart = 64 << 10

// ReadOldStart reads the start state an older launcher (one release
// back) wrote to datadir.Starting, for a clawmesh status run while such
// a launcher starts the stack (the binaries replaced under it): its pid,
// when it started and what it waits for. ErrNoLauncher when there is
// none, or its launcher is gone; refused as ReadProcessStates refuses.
func ReadOldStart(dir string) (int, StartState, error) {
	path := datadir.Starting(dir)
	raw, err := readStateFile(path, maxOldStart)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, StartState{}, ErrNoLauncher
	}
	if err != nil {
		return 0, StartState{}, err
	}
	lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 3)
	if len(lines) != 3 {
		return 0, StartState{}, fmt.Errorf("launcher state %s %w: %d lines, want 3", path, ErrStatesRefused, len(lines))
	}
	pid, err := strconv.Atoi(lines[0])
	since, err2 := strconv.ParseInt(lines[1], 10, 64)
	if err := errors.Join(err, err2); err != nil {
		return 0, StartState{}, fmt.Errorf("launcher state %s %w: %w", path, ErrStatesRefused, err)
	}
	if !launcherLives(pid, 0) {
		return 0, StartState{}, ErrNoLauncher
	}
	return pid, StartState{Since: time.Unix(since, 0), WaitsFor: lines[2]}, nil
}

// procStates writes the file. A nil *procStates writes nothing (tests
// of the supervisor alone).
//
// A change is made in memory and the file written by one goroutine of
// its own (writer), whole and synced (atomicfile.Replace: a temporary
// file created O_EXCL beside it, synced, renamed over, the folder
// synced): written unsynced, a crash of the machine could leave it cut
// or empty, and a fixed temporary name (".tmp") was opened through a
// link planted there. The changes made while one write is under way are
// written together by the next, and content that did not change is not
// written again: a start's sixteen changes (six of the start, ten of its
// processes) took sixteen writes, on the start's path.
type procStates struct {
	path string
	log  *zap.Logger

	mu      sync.Mutex
	st      ProcessStates
	gen     uint64 // changes made
	written uint64 // the last change written (or failed)
	last    []byte // what the file holds
	bad     bool   // a write failed: said once
	closed  bool
	flushed *sync.Cond // on mu: written moved, or closed

	wake chan struct{} // cap 1: a change to write
	stop chan struct{}
	done chan struct{} // the writer returned
}

func newProcStates(dir string, log *zap.Logger) *procStates {
	st := ProcessStates{LauncherPID: os.Getpid(), Processes: map[string]ProcessState{}}
	if self, err := procstat.Self(); err == nil {
		st.LauncherStart = self.Start
	}
	s := &procStates{path: datadir.Processes(dir), log: log, st: st,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.flushed = sync.NewCond(&s.mu)
	go s.writer()
	return s
}

// probing sets how the processes are probed: the probe's longest wait,
// and the silence after which one is killed.
func (s *procStates) probing(probeEvery, liveness time.Duration) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.ProbeEvery, s.st.Liveness = probeEvery, liveness
	s.changedLocked()
}

// starting says the start now waits for what; since is when it began.
func (s *procStates) starting(since time.Time, what string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Starting = &StartState{Since: since, WaitsFor: what}
	s.changedLocked()
}

// up says the start is over, and returns once the file says so: a
// client that read "is up" and then the file found the stack starting.
func (s *procStates) up() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.st.Starting = nil
	s.changedLocked()
	s.mu.Unlock()
	s.flush()
}

// flush returns once every change made so far is written (or its write
// failed), or the writer stopped.
func (s *procStates) flush() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.written < s.gen && !s.closed {
		s.flushed.Wait()
	}
}

// changedLocked counts a change and wakes the writer.
func (s *procStates) changedLocked() {
	s.gen++
	select {
	case s.wake <- struct{}{}:
	default: // a wake is pending: it writes this change too
	}
}

// writer writes the file on each wake until stop.
func (s *procStates) writer() {
	defer close(s.done)
	for {
		select {
		case <-s.wake:
			s.writeOnce()
		case <-s.stop:
			return
		}
	}
}

// writeOnce writes the states as they are now, unless the file holds
// them already.
func (s *procStates) writeOnce() {
	s.mu.Lock()
	gen := s.gen
	raw, err := json.Marshal(s.st)
	same := err == nil && bytes.Equal(raw, s.last)
	s.mu.Unlock()
	if err == nil && !same {
		err = atomicfile.Replace(s.path, raw, 0o600)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = gen
	if err == nil {
		s.last = raw
	}
	s.flushed.Broadcast()
	if err != nil && !s.bad {
		s.bad = true
		s.log.Warn("process states not written: clawmesh status shows what the gateway sees alone", zap.String("file", s.path), zap.Error(err))
	}
}

// change applies f to name's state.
func (s *procStates) change(name string, f func(*ProcessState)) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.st.Processes[name]
	f(&ps)
	s.st.Processes[name] = ps
	s.changedLocked()
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

// answered records a probe's outcome for the run pid, changing the
// states only when it changes what they say. Checked and changed under
// one lock: a run that exits meanwhile (exited) is not marked answered.
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
	s.changedLocked()
}

// remove stops the writer and deletes the file: the launcher stops
// supervising (or its start failed).
func (s *procStates) remove() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	s.flushed.Broadcast()
	s.mu.Unlock()
	<-s.done
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("process states not removed", zap.String("file", s.path), zap.Error(err))
	}
}
