// Package subreaper keeps a process's orphaned descendants in its tree:
// the process becomes their subreaper (Linux PR_SET_CHILD_SUBREAPER, no
// privilege needed) and reaps those it adopts when they exit.
//
// The launcher uses it so that the durable bridge's descendant check,
// which walks parent pids up to the launcher, holds for a descendant
// whose parent exited: after `setsid -f`, a double fork or `cmd &` in a
// shell that then exits, such a process was re-parented to init (or to
// a subreaper above the stack) and left the launcher's tree.
package subreaper

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/procstat"
)

// ErrNoPidfd is a kernel without the pidfds this package tells its own
// children by.
var ErrNoPidfd = errors.New("pidfds unavailable")

// Start makes this process the subreaper of its descendants and reaps,
// at every SIGCHLD, each exited child it does not hold a pidfd for: an
// adopted orphan. The children os/exec starts are left to their Wait: Go
// holds a pidfd for each from the moment it exists until Wait has reaped
// it. On a kernel without pidfds a reaper could not tell them apart, so
// Start refuses (ErrNoPidfd) and changes nothing. stop ends the
// reaping and the subreaper role; it is safe to call twice.
func Start() (stop func(), err error) {
	if err := pidfdsWork(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoPidfd, err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("become a subreaper: %w", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-sig:
				reapAdopted()
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(sig)
			close(done)
			<-exited
			_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
			reapAdopted()
		})
	}, nil
}

// reapAdopted reaps the exited children this process holds no pidfd
// for. The children are listed before the pidfds are read: a child
// os/exec starts after the listing is not in it, and one listed has had
// its pidfd since it was created, until its Wait reaped it (its pid is
// then gone, and a wait for it fails with ECHILD; only a pid reused by a
// new child within these few system calls could be waited here, which
// the kernel's cycling through pids makes all but impossible).
func reapAdopted() {
	kids := procstat.Children(os.Getpid())
	if len(kids) == 0 {
		return
	}
	own := pidfdPIDs()
	for _, pid := range kids {
		if own[pid] {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

// pidfdPIDs lists the pids this process holds a pidfd for.
func pidfdPIDs() map[int]bool {
	own := map[int]bool{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err != nil || !strings.Contains(link, "pidfd") {
			continue
		}
		if pid, ok := fdinfoPID(filepath.Join("/proc/self/fdinfo", fd.Name())); ok {
			own[pid] = true
		}
	}
	return own
}

// fdinfoPID reads the "Pid:" line of a pidfd's fdinfo.
func fdinfoPID(path string) (int, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			return pid, err == nil && pid > 0
		}
	}
	return 0, false
}

// pidfdsWork checks that a pidfd can be opened and that its fdinfo names
// its pid, as reapAdopted reads it.
func pidfdsWork() error {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	if pid, ok := fdinfoPID("/proc/self/fdinfo/" + strconv.Itoa(fd)); !ok || pid != os.Getpid() {
		return errors.New("a pidfd's fdinfo does not name its pid")
	}
	return nil
}
