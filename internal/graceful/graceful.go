// Package graceful stops child processes the one way the stack does: a
// signal, a grace period, then SIGKILL.
package graceful

import (
	"os"
	"syscall"
	"time"
)

// Stop sends sig to p and waits up to grace for exited to close; then it
// kills p and waits for exited. It reports whether p had to be killed. A
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
	_ = p.Signal(syscall.SIGKILL)
	<-exited
	return true
}
