// Package graceful stops child processes the one way the stack does: a
// signal, a grace period, then SIGKILL.
package graceful

import (
	"os"
	"syscall"
	"time"

	"github.com/clawmesh/clawmesh/internal/procstat"
)

// Stop sends sig to p and waits up to grace for exited to close; then it
// kills p with what it started (KillTree) and waits for exited. It reports whether p had to be killed. A
// process that already exited is left alone.
func Stop(p *os.Process, exited <-chan struct{}, sig os.Signal, grace time.Duration) (killed bool) {
	select {
	case <-exited:
		return false
	default:
	}
	_ = p.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
		return false
	case <-t.C:
	}
	KillTree(p.Pid)
	<-exited
	return true
}

// KillTree kills a process with the processes it started: its
// process group (every child runs in one of its own, Setpgid) and its
// own children, each with its group. PostgreSQL's backends are the
// postmaster's children, each in a session of its own (setsid): killed
// alone, a postmaster hung with its backends (a SIGSTOP, a frozen host)
// left them holding the cluster's shared memory, and each new postmaster
// exited at once, restarted in a loop with the database down until they
// went. The children are listed before the kill, while their parent is
// theirs.
func KillTree(pid int) {
	children := procstat.Children(pid)
	killGroup(pid)
	for _, c := range children {
		killGroup(c)
	}
}

// killGroup kills the group pid leads, or pid alone when it leads none.
func killGroup(pid int) {
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
