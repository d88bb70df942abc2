package launcher

import (
	"errors"
	"os"
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
	s := newProcStates(dir, time.Second, 10*time.Second, zap.NewNop())
	s.started("session", 4242)
	s.answered("session", 4242, true, time.Now())
	last := time.Now().Add(-3 * time.Second)
	s.answered("session", 4242, false, last)
	s.exited("plugin-sandbox", 2, "signal: killed", time.Minute)
	s.answered("plugin-sandbox", 77, true, time.Now()) // no run of that pid
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
