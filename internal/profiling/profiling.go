// Package profiling writes a process's CPU, block and mutex profiles to a
// folder when the environment asks for it, so a benchmark of the whole
// stack (separate binaries under `clawmesh up`) can be profiled process by
// process. It is off unless EnvDir is set: profiling costs CPU and the
// block profile slows every channel and lock.
package profiling

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
)

// EnvDir names the folder profiles are written to; each process writes
// <name>-<pid>.cpu.pprof while it runs and <name>-<pid>.block.pprof,
// .mutex.pprof and .heap.pprof when it stops (after a graceful stop only:
// a killed process leaves its CPU profile unfinished).
const EnvDir = "CLAWMESH_PROFILE_DIR"

// EnvTrace, set to 1 beside EnvDir, also makes each process write an
// execution trace, <name>-<pid>.trace (go tool trace), while it runs: the
// goroutine hand-offs and system calls of a latency path. A trace grows
// by megabytes a second under load: for short runs.
const EnvTrace = "CLAWMESH_PROFILE_TRACE"

// EnvCPUOnly, set to 1 beside EnvDir, leaves the block and mutex
// profiles off: their sampling slows every channel operation and lock,
// and a CPU profile taken beside them charges the process that
// bookkeeping (a quarter of the gateway's CPU a chunk on the turn
// stream), so a CPU profile meant to be compared with another process's
// is taken alone.
const EnvCPUOnly = "CLAWMESH_PROFILE_CPU_ONLY"

// EnvHz, beside EnvDir, sets the CPU profile's sampling rate in samples
// a second (the runtime's default is 100; the runtime says on stderr that
// it keeps the rate set first). The kernel's CPU timers tick at its HZ,
// so a rate past that gets no more samples: on the turn stream a 1000 Hz
// profile held fewer than a 100 Hz one (docs/performance.md,
// "Fifty-eighth round: fan-out"); perf sees more, and sees the runtime's
// monitor thread, which a Go CPU profile never samples.
const EnvHz = "CLAWMESH_PROFILE_HZ"

// BlockRate is the block profile's sampling: one event per this many
// nanoseconds blocked. MutexFraction samples one contention event in so
// many.
const (
	BlockRate     = 10_000
	MutexFraction = 10
)

// Start begins profiling the process named name when EnvDir is set and
// returns the function that stops it and writes the profiles; without
// EnvDir both do nothing.
func Start(name string) (stop func() error, err error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return func() error { return nil }, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("profile folder: %w", err)
	}
	base := filepath.Join(dir, name+"-"+strconv.Itoa(os.Getpid()))
	cpu, err := os.Create(base + ".cpu.pprof")
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if hz, err := strconv.Atoi(os.Getenv(EnvHz)); err == nil && hz > 0 && hz <= 10_000 {
		// Set before StartCPUProfile, which keeps a rate already set
		// (and says so on stderr).
		runtime.SetCPUProfileRate(hz)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		cpu.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	var tf *os.File
	if os.Getenv(EnvTrace) == "1" {
		if tf, err = os.Create(base + ".trace"); err != nil {
			pprof.StopCPUProfile()
			cpu.Close()
			return nil, fmt.Errorf("trace: %w", err)
		}
		if err := trace.Start(tf); err != nil {
			pprof.StopCPUProfile()
			cpu.Close()
			tf.Close()
			return nil, fmt.Errorf("trace: %w", err)
		}
	}
	cpuOnly := os.Getenv(EnvCPUOnly) == "1"
	if !cpuOnly {
		runtime.SetBlockProfileRate(BlockRate)
		runtime.SetMutexProfileFraction(MutexFraction)
	}
	return func() error {
		pprof.StopCPUProfile()
		errs := []error{cpu.Close()}
		if tf != nil {
			trace.Stop()
			errs = append(errs, tf.Close())
		}
		kinds := []string{"block", "mutex", "heap"}
		if cpuOnly {
			kinds = []string{"heap"}
		}
		for _, p := range kinds {
			errs = append(errs, write(base+"."+p+".pprof", p))
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func write(path, profile string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s profile: %w", profile, err)
	}
	if err := pprof.Lookup(profile).WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("%s profile: %w", profile, err)
	}
	return f.Close()
}
