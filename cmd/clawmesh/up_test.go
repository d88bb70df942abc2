package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/stack"
)

// A terminal that closes under a foreground `clawmesh up` (a window shut,
// an ssh session dropped) sends it SIGHUP. The launcher died of it at
// once: its children were stopped all together by their parent-death
// signal, in no order, and their sockets and dormant markers were left
// in the data directory. It now stops in order, as on SIGINT and SIGTERM:
// here during the start, which exits 130 and says so.
func TestUpStopsInOrderOnHangup(t *testing.T) {
	base, err := os.MkdirTemp("", "cm-up-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	data, bin := filepath.Join(base, "d"), filepath.Join(base, "bin")
	for _, d := range []string{data, bin} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Services that never become healthy: the start waits for them.
	for _, p := range stack.Processes {
		if err := os.WriteFile(filepath.Join(bin, p.Name), []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "up", "--config-dir", data, "--bin-dir", bin)
	cmd.Env = append(os.Environ(), asMain+"=1", "DATABASE_URL=postgres:///none?host=/nonexistent", "ZEROCLAW_SOCKET=")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Once the services run, the launcher is waiting for their health.
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), `"child":"`+stack.Processes[0].Name+`"`) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the services never started:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted || !strings.Contains(stderr.String(), "interrupted while starting") {
		t.Fatalf("up after SIGHUP: %v (exit %d)\n%s", err, code, stderr.String())
	}
	if socks, _ := filepath.Glob(filepath.Join(data, "*.sock")); len(socks) != 0 {
		t.Fatalf("sockets left behind: %v", socks)
	}
}

// lockedBuffer is a buffer the test reads while a process writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
