package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Replicas of the sandbox share one compilation cache folder and start
// together. Each compiled the same plugins into the empty folder at once
// (2 to 2.6 s of CPU a Go guest, each replica), so that a first start of
// N replicas cost N times the work of one: on a busy machine, more than
// the launcher's readiness bound. A compile now runs under a lock on the
// folder (a file beside it, flock: a replica killed releases it): the
// first replica compiles and writes the entry, the others wait and then
// load the entry (about 150 ms). Modules compile one at a time across
// the replicas sharing a folder; a single replica compiled them one at a
// time already (a scan loads its plugins in turn).

// compileLockPoll is how often a compile waiting for the lock tries it
// again: the wait is for a compile of seconds.
const compileLockPoll = 25 * time.Millisecond

// compileLockWait bounds the wait for another process's compile: past it
// the module is compiled without the lock (only the work is repeated;
// the cache's entries are written whole and renamed into place).
var compileLockWait = 5 * time.Minute

// compileLockPath is the lock file of a cache folder: beside it, so that
// the cache's trim, which removes the folder's files, never removes it,
// and a folder removed by hand leaves the lock in place.
func compileLockPath(cacheDir string) string {
	return filepath.Clean(cacheDir) + ".lock"
}

// lockCompile takes the cache folder's compile lock, telling waiting
// (when not nil) first if another process holds it. It returns the
// release, or a no-op when there is no folder or the lock cannot be
// had (a file system without flock, the wait's bound passed): the
// compile goes ahead without it. It fails only when ctx ends.
func (h *Host) lockCompile(ctx context.Context, waiting func()) (func(), error) {
	if h.cfg.CacheDir == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(compileLockPath(h.cfg.CacheDir), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		h.logger.Warn("compilation cache lock not opened; compiling without it")
		return func() {}, nil
	}
	release := func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
	deadline := time.NewTimer(compileLockWait)
	defer deadline.Stop()
	tick := time.NewTicker(compileLockPoll)
	defer tick.Stop()
	told := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return release, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return func() {}, nil
		}
		if !told && waiting != nil {
			told = true
			waiting()
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wasmhost: waiting for another process's compile: %w", context.Cause(ctx))
		case <-deadline.C:
			f.Close()
			h.logger.Warn("another process held the compilation cache's lock past the bound; compiling without it",
				zap.Duration("waited", compileLockWait))
			return func() {}, nil
		case <-tick.C:
		}
	}
}

// cacheEntries counts the cache folder's entries (temporary files
// aside): a compile that adds one compiled the module, one that adds
// none loaded it.
func cacheEntries(dir string) int {
	n := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasSuffix(d.Name(), ".tmp") {
			n++
		}
		return nil
	})
	return n
}

// compileTicks tells Config.Progress, during a compile, each second of
// CPU the process has spent since it began: a compile says nothing until
// it ends, and a Go guest's took a minute of a busy machine's time with
// the same words in health all along, which the launcher's readiness
// bound took for a stall. CPU spent is work done; a process stuck
// waiting spends none. It returns the stop, which waits for the ticker.
func (h *Host) compileTicks(what string) (stop func()) {
	if h.cfg.Progress == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	began := processCPU()
	go func() {
		defer close(done)
		tick := time.NewTicker(compileTickEvery)
		defer tick.Stop()
		said := time.Duration(0)
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			if spent := (processCPU() - began).Truncate(time.Second); spent > said {
				said = spent
				h.progress(fmt.Sprintf("%s: %v of CPU so far", what, spent))
			}
		}
	}()
	return func() { close(quit); <-done }
}

// compileTickEvery is how often a compile's CPU is read (a getrusage).
const compileTickEvery = 250 * time.Millisecond

// processCPU is the CPU time the process has spent, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
