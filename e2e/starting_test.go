package e2e_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
)

// The gateway, which answers status, starts last: a start waiting for
// PostgreSQL (here stopped with SIGSTOP) showed to `clawmesh status` as
// no stack at all, "start one with `clawmesh up`", which the lock then
// refused. Status now says the stack is starting and what it waits for.
func TestStatusDuringAStartSaysStartingAndWhy(t *testing.T) {
	if _, err := pgcluster.Binaries(); err != nil {
		t.Skipf("a stack with its own cluster: %v", err)
	}
	t.Parallel()
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := e2e.TempDataDir(t)
	t.Cleanup(func() {
		if c := pgcluster.Dir(dir); c != "" && !strings.HasPrefix(c, dir+"/") {
			os.RemoveAll(c)
			os.RemoveAll(filepath.Join(pgcluster.RootKeys, filepath.Base(c)))
		}
	})
	run := startUp(t, bin, dir, "DATABASE_URL=")
	up, upErr := run.cmd, run.stderr
	// The postmaster, once its lock file names it: stopped, it accepts
	// no connection, and the start waits for it (or, past that, the
	// services wait for their database).
	deadline := time.Now().Add(60 * time.Second)
	var pg int
	for pg == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no postmaster after 60 s:\n%s", upErr.String())
		}
		if c := pgcluster.Dir(dir); c != "" {
			raw, _ := os.ReadFile(filepath.Join(c, "data", "postmaster.pid"))
			if n, err := strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0]); err == nil && n > 0 {
				pg = n
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	run.stop(t, pg)
	status := exec.Command(filepath.Join(bin, "clawmesh"), "status", "--config-dir", dir)
	status.Env = append(os.Environ(), "ZEROCLAW_SOCKET=", "ZEROCLAW_TOKEN=")
	var out bytes.Buffer
	status.Stdout, status.Stderr = &out, &out
	err = status.Run()
	if err == nil || !strings.Contains(out.String(), "the stack is starting, not serving yet: waiting for") ||
		!strings.Contains(out.String(), "launcher pid "+strconv.Itoa(up.Process.Pid)) {
		t.Fatalf("status while the start waits for postgres (%v):\n%s\nlauncher:\n%s", err, out.String(), upErr.String())
	}
	t.Logf("%s", out.String())
}

// A service that does not serve was shown by `clawmesh status` as a state
// word alone ("unreachable"), its cause only in clawmesh call health or
// doctor; then with the gateway's reason, which for a stopped process
// (SIGSTOP: hung) was "unreachable (context deadline exceeded)". The
// launcher, which probes each process, knows it is silent: status says
// it hung, for how long, and when the launcher restarts it.
func TestStatusSaysWhyAServiceDoesNotServe(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "5m"}})
	sandbox := s.PIDOf("plugin-sandbox")
	if sandbox == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}
	hang(t, sandbox)
	line, out := waitStatusLine(t, s, "plugin-sandbox", "hung")
	want := "hung (pid " + strconv.Itoa(sandbox) + " not answering health within 1s, silent for "
	if !strings.HasPrefix(line, "plugin-sandbox  "+want) || !strings.Contains(line, "the launcher restarts it after 5m0s of silence") {
		t.Fatalf("status of the stopped plugin-sandbox, want %q:\n%s", want, out)
	}
	t.Logf("%s", line)
	// clawmesh health, given the data directory, names the process and
	// adds the same: it said "context deadline exceeded" alone.
	out, err := clawmesh(t, s, "health", "--config-dir", s.DataDir, "--timeout", "500ms", "plugin-sandbox")
	if err == nil || !strings.Contains(out, "the launcher says plugin-sandbox: hung (pid "+strconv.Itoa(sandbox)+" not answering health within 1s") {
		t.Fatalf("clawmesh health of the stopped plugin-sandbox (%v):\n%s", err, out)
	}
	t.Logf("%s", out)
}

// A service the launcher restarts after a crash read "unreachable" with
// the gateway's dial error, as if nothing were being done about it.
// Killed again at each run (the backoff grows to seconds), status says
// it is restarting, the attempt and how the last run ended.
func TestStatusSaysAServiceIsRestarting(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "5m"}})
	deadline := time.Now().Add(60 * time.Second)
	killed := 0
	for {
		out, err := clawmesh(t, s, "status")
		line := statusLine(out, "plugin-sandbox")
		if err != nil && strings.Contains(line, "restarting (attempt ") {
			if !strings.Contains(line, "last exit: signal: killed, ") {
				t.Fatalf("status of the restarting plugin-sandbox names no last exit:\n%s", out)
			}
			t.Logf("%s", line)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never said plugin-sandbox restarts (%d kills):\n%s", killed, out)
		}
		// Kill each new run: the launcher's backoff doubles (0.1 s,
		// 0.2 s, ... up to 10 s), a window status cannot miss.
		if pid := s.PIDOf("plugin-sandbox"); pid != 0 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// statusLine is the line of status output out about service.
func statusLine(out, service string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), service+" ") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// waitStatusLine runs clawmesh status until its line about service
// holds word (status failing, as it does while a service is down), for
// up to 60 s.
func waitStatusLine(t *testing.T, s *e2e.Stack, service, word string) (line, out string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := clawmesh(t, s, "status")
		line := statusLine(out, service)
		if err != nil && strings.Contains(line, word) {
			return line, out
		}
		if time.Now().After(deadline) {
			t.Fatalf("status's %s line never said %q in 60 s:\n%s", service, word, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// upRun is a `clawmesh up` a test started by hand, with at most one of
// its processes stopped (SIGSTOP) by the test.
type upRun struct {
	cmd     *exec.Cmd
	stderr  *e2e.LockedBuffer
	stopped int
}

// startUp starts `clawmesh up` on the data directory dir with the client
// socket left to the data directory and env added. At the test's end the
// stopped process is resumed first, so that the launcher's SIGTERM can
// stop it, then the launcher is stopped, and killed after 60 s.
func startUp(t *testing.T, bin, dir string, env ...string) *upRun {
	t.Helper()
	r := &upRun{stderr: &e2e.LockedBuffer{}}
	r.cmd = exec.Command(filepath.Join(bin, "clawmesh"), "up", "--config-dir", dir)
	r.cmd.Env = append(append(os.Environ(), "ZEROCLAW_SOCKET="), env...)
	r.cmd.Stderr = r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if r.stopped > 0 {
			_ = syscall.Kill(r.stopped, syscall.SIGCONT)
		}
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = r.cmd.Process.Kill()
			<-exited
		}
	})
	return r
}

// stop stops the process pid (SIGSTOP) until the test's end.
func (r *upRun) stop(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r.stopped = pid
}
