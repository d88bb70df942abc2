package graceful_test

import (
	"bufio"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/graceful"
)

// A process that outlives its grace is killed with what it started, a
// child in a session of its own included (as PostgreSQL's backends are):
// left alive, such a child held what the process's next start needed.
func TestStopKillsWhatTheProcessStarted(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	cmd := exec.Command("sh", "-c", `trap '' TERM; setsid sleep 300 & echo $!; while :; do sleep 1; done`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if !graceful.Stop(cmd.Process, exited, syscall.SIGTERM, 200*time.Millisecond) {
		t.Fatal("a process ignoring its stop signal was not killed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Kill(child, 0)
		if errors.Is(err, syscall.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child in its own session outlived the kill (signal 0: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
