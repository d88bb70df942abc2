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
	up := exec.Command(filepath.Join(bin, "clawmesh"), "up", "--config-dir", dir)
	up.Env = append(os.Environ(), "ZEROCLAW_SOCKET=", "DATABASE_URL=")
	var upErr e2e.LockedBuffer
	up.Stderr = &upErr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = up.Wait(); close(exited) }()
	var pg int
	t.Cleanup(func() {
		if pg > 0 {
			_ = syscall.Kill(pg, syscall.SIGCONT)
		}
		_ = up.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = up.Process.Kill()
			<-exited
		}
		if c := pgcluster.Dir(dir); c != "" && !strings.HasPrefix(c, dir+"/") {
			os.RemoveAll(c)
			os.RemoveAll(filepath.Join(pgcluster.RootKeys, filepath.Base(c)))
		}
	})
	// The postmaster, once its lock file names it: stopped, it accepts
	// no connection, and the start waits for it (or, past that, the
	// services wait for their database).
	deadline := time.Now().Add(60 * time.Second)
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
	if err := syscall.Kill(pg, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
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
// doctor. Status now gives the reason the gateway recorded beside it.
func TestStatusSaysWhyAServiceDoesNotServe(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "5m"}})
	sandbox := s.PIDOf("plugin-sandbox")
	if sandbox == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}
	hang(t, sandbox)
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := clawmesh(t, s, "status")
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "plugin-sandbox ") {
				line = strings.TrimSpace(l)
			}
		}
		if err != nil && strings.Contains(line, "unreachable") {
			if !strings.Contains(line, "unreachable (") {
				t.Fatalf("status names no reason for the stopped plugin-sandbox:\n%s", out)
			}
			t.Logf("%s", line)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status still says plugin-sandbox serves 60 s after it was stopped:\n%s", out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
