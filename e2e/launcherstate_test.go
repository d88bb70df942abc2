package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/launcher"
	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// statusOn runs clawmesh status on the data directory dir, killed after
// limit: a status that hangs is a failure, not a slow test.
func statusOn(t *testing.T, bin, dir string, limit time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "clawmesh"), "status", "--config-dir", dir)
	cmd.Env = append(os.Environ(), "ZEROCLAW_SOCKET=", "ZEROCLAW_TOKEN=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("clawmesh status still ran after %s:\n%s", limit, out.String())
	}
	return out.String(), err
}

// The launcher's state file is the owner's, in a private folder, but a
// crash (its data never synced), a fault of the disk or a process of the
// same user can leave anything there. Each was read as no launcher at
// all, status advising to start a stack, and a FIFO in place of the
// start state (read whole, through links) hung status for good. Each is
// now refused, named, and status ends.
func TestStatusRefusesABadLauncherStateFile(t *testing.T) {
	t.Parallel()
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	live := strconv.Itoa(os.Getpid()) // a live pid: the file is not dismissed as a dead launcher's
	whole := `{"launcher_pid":` + live + `,"starting":{"since":"2026-01-01T00:00:00Z","waits_for":"postgres"},"processes":{}}`
	for _, tc := range []struct {
		name string
		make func(path string) error
		says string
	}{
		{"torn", func(p string) error { return os.WriteFile(p, []byte(whole[:len(whole)/2]), 0o600) }, "unexpected end of JSON input"},
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o600) }, "unexpected end of JSON input"},
		{"garbage", func(p string) error { return os.WriteFile(p, []byte("\x00\xff garbage"), 0o600) }, "invalid character"},
		{"oversized", func(p string) error {
			return os.WriteFile(p, append([]byte(whole), bytes.Repeat([]byte(" "), 2<<20)...), 0o600)
		}, "larger than"},
		{"symlink", func(p string) error {
			real := p + ".real"
			if err := os.WriteFile(real, []byte(whole), 0o600); err != nil {
				return err
			}
			return os.Symlink(real, p)
		}, "symbolic link"},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(datadir.Processes(dir)); err != nil {
				t.Fatal(err)
			}
			out, err := statusOn(t, bin, dir, 20*time.Second)
			if err == nil || !strings.Contains(out, "launcher state "+datadir.Processes(dir)+" refused") || !strings.Contains(out, tc.says) {
				t.Fatalf("status with a %s state file (%v), want it refused (%q):\n%s", tc.name, err, tc.says, out)
			}
			t.Logf("%s", out)
		})
	}
	// The start state of a launcher from before the two files were one
	// is still read (an upgrade while a start runs), as carefully.
	t.Run("old start state fifo", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "d")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(filepath.Join(dir, "clawmesh.starting"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := statusOn(t, bin, dir, 20*time.Second)
		if err == nil || !strings.Contains(out, "not a regular file") {
			t.Fatalf("status with a FIFO as the old start state (%v):\n%s", err, out)
		}
	})
	t.Run("old start state", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "d")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		old := live + "\n" + strconv.FormatInt(time.Now().Unix(), 10) + "\nwaiting for postgres\n"
		if err := os.WriteFile(filepath.Join(dir, "clawmesh.starting"), []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := statusOn(t, bin, dir, 20*time.Second)
		if err == nil || !strings.Contains(out, "the stack is starting, not serving yet: waiting for postgres (launcher pid "+live) {
			t.Fatalf("status with an old launcher's start state (%v):\n%s", err, out)
		}
	})
}

// A second start (the schemas there, the cluster made) passes the wait
// for PostgreSQL at once, and the launcher listens on the client socket
// before the services serve: status connected, and its initialize
// waited in the socket's backlog for a gateway not started yet, 60 s,
// then "i/o timeout", while the launcher's state said what the start
// waited for. Here session is stopped (SIGSTOP) during the second start:
// status says the stack is starting and why. A stopped stack says so.
func TestStatusDuringASecondStartSaysStarting(t *testing.T) {
	t.Parallel()
	dbURL := testenv.Postgres(t)
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir, Env: []string{"DATABASE_URL=" + dbURL}})
	s.Stop()
	out, err := statusOn(t, s.BinDir, dir, 20*time.Second)
	if err == nil || !strings.Contains(out, "no stack listens on "+datadir.Socket(dir)+": start one") {
		t.Fatalf("status of a stopped stack (%v):\n%s", err, out)
	}

	run := startUp(t, s.BinDir, dir, "DATABASE_URL="+dbURL)
	up, upErr := run.cmd, run.stderr
	session := 0
	deadline := time.Now().Add(60 * time.Second)
	for session == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no session process after 60 s:\n%s", upErr.String())
		}
		for _, pid := range procstat.Children(up.Process.Pid) {
			if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) == "session" {
				session = pid
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	run.stop(t, session)
	// Until the launcher listens: the fault is status on its socket.
	for _, err := os.Stat(datadir.Socket(dir)); err != nil; _, err = os.Stat(datadir.Socket(dir)) {
		if time.Now().After(deadline) {
			t.Fatalf("no client socket after 60 s:\n%s", upErr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	out, err = statusOn(t, s.BinDir, dir, 20*time.Second)
	if err == nil || !strings.Contains(out, "the stack is starting, not serving yet: waiting for ") ||
		!strings.Contains(out, "session") || !strings.Contains(out, "launcher pid "+strconv.Itoa(up.Process.Pid)) {
		t.Fatalf("status during a second start, session stopped (%v):\n%s\nlauncher:\n%s", err, out, upErr.String())
	}
	t.Logf("%s", out)
}

// A gateway that hangs (SIGSTOP) takes the launcher's client socket with
// it: status's initialize waited its 60 s and said "i/o timeout", while
// the launcher knew the gateway was silent. Status says it hung.
func TestStatusSaysTheGatewayHung(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "5m"}})
	gw := s.PIDOf("gateway")
	if gw == 0 {
		t.Fatalf("no gateway among %v", s.PIDs())
	}
	hang(t, gw)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ls, err := launcher.ReadProcessStates(s.DataDir)
		if err != nil && !errors.Is(err, launcher.ErrNoLauncher) {
			t.Fatal(err)
		}
		if !ls.Processes["gateway"].SilentSince.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the launcher never saw the stopped gateway silent: %+v", ls)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, err := statusOn(t, s.BinDir, s.DataDir, 20*time.Second)
	if err == nil || !strings.Contains(out, "gateway hung (pid "+strconv.Itoa(gw)+" not answering health") {
		t.Fatalf("status with the gateway stopped (%v):\n%s", err, out)
	}
	t.Logf("%s", out)
}
