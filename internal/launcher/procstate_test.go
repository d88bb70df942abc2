package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
)

// The states read back as written, a run's first answer and silence
// each change the file once, a probe of a run that exited changes
// nothing, a link in place of the file is not followed, and a file
// whose launcher is gone says nothing.
func TestProcessStatesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := newProcStates(dir, zap.NewNop())
	s.probing(time.Second, 10*time.Second)
	s.started("session", 4242)
	s.answered("session", 4242, true, time.Now())
	last := time.Now().Add(-3 * time.Second)
	s.answered("session", 4242, false, last)
	s.exited("plugin-sandbox", 2, "signal: killed", time.Minute)
	s.answered("plugin-sandbox", 77, true, time.Now()) // no run of that pid
	s.flush()
	got, err := ReadProcessStates(dir)
	if err != nil {
		t.Fatal(err)
	}
	ss, ps := got.Processes["session"], got.Processes["plugin-sandbox"]
	if ss.PID != 4242 || !ss.Answered || !ss.SilentSince.Equal(last) || got.ProbeEvery != time.Second || got.Liveness != 10*time.Second {
		t.Fatalf("session %+v in %+v", ss, got)
	}
	if ps.PID != 0 || ps.Restarts != 2 || ps.LastExit != "signal: killed" || ps.Answered || time.Until(ps.RestartAt) < 50*time.Second {
		t.Fatalf("plugin-sandbox %+v", ps)
	}

	path := datadir.Processes(dir)
	if err := os.Rename(path, path+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path+".real", path); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadProcessStates(dir); err == nil {
		t.Fatal("read through a symbolic link")
	}
	if err := os.WriteFile(path+".dead", []byte(`{"launcher_pid":2147483647,"processes":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".dead", path); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadProcessStates(dir); !errors.Is(err, ErrNoLauncher) {
		t.Fatalf("a dead launcher's file: %v", err)
	}
	s.remove()
	if _, err := ReadProcessStates(dir); !errors.Is(err, ErrNoLauncher) {
		t.Fatalf("after remove: %v", err)
	}
}

// The start state is carried by the same file, gone once the stack is up
// (up returns after the file says so); a change that leaves the content
// as it was writes nothing; the launcher's start time is kept beside its
// pid, and a file naming a live pid with another start time is a dead
// launcher's.
func TestProcessStatesCarryTheStart(t *testing.T) {
	dir := t.TempDir()
	s := newProcStates(dir, zap.NewNop())
	defer s.remove()
	since := time.Now().Add(-time.Second).Truncate(time.Second)
	st := newStartState(s)
	st.since = since
	st.set("waiting for postgres")
	s.flush()
	got, err := ReadProcessStates(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Starting == nil || got.Starting.WaitsFor != "waiting for postgres" || !got.Starting.Since.Equal(since) || got.LauncherStart == 0 {
		t.Fatalf("while starting: %+v", got)
	}
	s.up()
	got, err = ReadProcessStates(dir)
	if err != nil || got.Starting != nil {
		t.Fatalf("once up: %+v, %v", got, err)
	}
	before, err := os.Stat(datadir.Processes(dir))
	if err != nil {
		t.Fatal(err)
	}
	s.probing(got.ProbeEvery, got.Liveness) // the same values
	s.flush()
	after, err := os.Stat(datadir.Processes(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Fatal("content unchanged, written again")
	}

	raw, err := os.ReadFile(datadir.Processes(dir))
	if err != nil {
		t.Fatal(err)
	}
	var other ProcessStates
	if err := json.Unmarshal(raw, &other); err != nil {
		t.Fatal(err)
	}
	other.LauncherStart++
	raw, _ = json.Marshal(other)
	if err := os.WriteFile(filepath.Join(dir, "other"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "other"), datadir.Processes(dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadProcessStates(dir); !errors.Is(err, ErrNoLauncher) {
		t.Fatalf("a live pid started at another time: %v", err)
	}
}

// What a start says it waits for before a process starts is in the file
// when the process can first be seen: setWritten returns once it is
// written, with no flush of the caller's.
func TestStartStateWrittenBeforeAProcessStarts(t *testing.T) {
	dir := t.TempDir()
	s := newProcStates(dir, zap.NewNop())
	defer s.remove()
	st := newStartState(s)
	for i := range 50 {
		want := fmt.Sprintf("waiting for postgres (%d)", i)
		st.setWritten(want)
		got, err := ReadProcessStates(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got.Starting == nil || got.Starting.WaitsFor != want {
			t.Fatalf("right after setWritten(%q) the file says %+v", want, got.Starting)
		}
	}
}

// Anything but a regular file holding one JSON object is refused, named;
// a FIFO does not block the reader.
func TestProcessStatesRefused(t *testing.T) {
	dir := t.TempDir()
	path := datadir.Processes(dir)
	for name, mk := range map[string]func() error{
		"cut":     func() error { return os.WriteFile(path, []byte(`{"launcher_pid":1,"proc`), 0o600) },
		"big":     func() error { return os.WriteFile(path, make([]byte, maxStatesFile+1), 0o600) },
		"fifo":    func() error { return syscall.Mkfifo(path, 0o600) },
		"symlink": func() error { return os.Symlink("/dev/zero", path) },
	} {
		_ = os.Remove(path)
		if err := mk(); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadProcessStates(dir); !errors.Is(err, ErrStatesRefused) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
