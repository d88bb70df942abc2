package launcher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

var fake struct {
	once sync.Once
	bin  string
	err  error
}

// fakeBin builds testdata/fakeproc once per test process.
func fakeBin(t *testing.T) string {
	t.Helper()
	fake.once.Do(func() {
		dir, err := os.MkdirTemp("", "cm-fake-")
		if err != nil {
			fake.err = err
			return
		}
		fake.bin = filepath.Join(dir, "fakeproc")
		out, err := exec.Command("go", "build", "-o", fake.bin, "./testdata/fakeproc").CombinedOutput()
		if err != nil {
			fake.err = fmt.Errorf("build fakeproc: %w\n%s", err, out)
		}
	})
	if fake.err != nil {
		t.Fatal(fake.err)
	}
	return fake.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fake.bin != "" {
		os.RemoveAll(filepath.Dir(fake.bin))
	}
	os.Exit(code)
}

// rig is a supervisor over fake processes, with its log observed.
type rig struct {
	t    *testing.T
	dir  string
	sup  *supervisor
	logs *observer.ObservedLogs
	mu   sync.Mutex
	// restarts are the onRestart notices.
	restarts []string
}

func newRig(t *testing.T, liveness time.Duration) *rig {
	t.Helper()
	dir, err := os.MkdirTemp("", "cm-sup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	core, logs := observer.New(zap.InfoLevel)
	r := &rig{t: t, dir: dir, logs: logs}
	r.sup = newSupervisor(zap.New(core), dir, liveness)
	r.sup.onRestart = func(name string, n int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.restarts = append(r.restarts, fmt.Sprintf("%s:%d", name, n))
	}
	t.Cleanup(r.sup.stopAll)
	return r
}

// proc is a fake process; mode and env as fakeproc reads them.
func (r *rig) proc(name, mode string, env ...string) *proc {
	r.t.Helper()
	bin := fakeBin(r.t)
	sock := filepath.Join(r.dir, name+".sock")
	probe, err := newHealthProbe(sock)
	if err != nil {
		r.t.Fatal(err)
	}
	penv := append(os.Environ(), append([]string{"FAKE_MODE=" + mode, "FAKE_RECORD=" + r.record(name)}, env...)...)
	return &proc{name: name, probe: probe, command: func() *exec.Cmd {
		cmd := exec.Command(bin, "--listen", sock)
		cmd.Env = penv
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		return cmd
	}}
}

func (r *rig) record(name string) string { return filepath.Join(r.dir, name+".runs") }

type start struct {
	pid int
	at  time.Time
}

// runs reads the runs a fake process recorded.
func (r *rig) runs(name string) []start {
	raw, _ := os.ReadFile(r.record(name))
	var out []start
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, _ := strconv.Atoi(f[0])
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		out = append(out, start{pid, time.Unix(0, ns)})
	}
	return out
}

func (r *rig) eventually(wait time.Duration, fn func() error) {
	r.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("after %v: %v", wait, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func noStop(error) {}

// A crashing process is restarted with a doubling backoff, each restart
// logged and announced.
func TestSupervisorRestartsWithBackoff(t *testing.T) {
	r := newRig(t, 0)
	r.sup.minBackoff, r.sup.maxBackoff = 50*time.Millisecond, 200*time.Millisecond
	p := r.proc("crasher", "crash")
	if err := r.sup.start(p, noStop); err != nil {
		t.Fatal(err)
	}
	r.eventually(10*time.Second, func() error {
		if n := len(r.runs("crasher")); n < 5 {
			return fmt.Errorf("%d runs", n)
		}
		return nil
	})
	r.sup.stopAll()
	runs := r.runs("crasher")
	want := []time.Duration{50, 100, 200, 200} // ms: doubling, capped
	for i, min := range want {
		if gap := runs[i+1].at.Sub(runs[i].at); gap < min*time.Millisecond {
			t.Errorf("restart %d came %v after the previous start, before its backoff %v", i+1, gap, min*time.Millisecond)
		}
	}
	if n := r.logs.FilterMessage("process exited, restarting").FilterField(zap.String("child", "crasher")).Len(); n < 4 {
		t.Errorf("%d restart lines logged", n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.restarts) < 4 || r.restarts[0] != "crasher:1" || r.restarts[3] != "crasher:4" {
		t.Errorf("restart notices %v", r.restarts)
	}
}

// A process that exits with service.ExitPermanent (a failure no restart
// mends) is not restarted: the stack is stopped, saying why.
func TestPermanentFailureStopsTheStack(t *testing.T) {
	r := newRig(t, 0)
	r.sup.minBackoff = time.Millisecond
	p := r.proc("config", "crash", "FAKE_CODE=78", "FAKE_MESSAGE=config: the key does not open the stored secrets")
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	if err := r.sup.start(p, stop); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the stack was not stopped; runs %v", r.runs("config"))
	}
	err := context.Cause(ctx)
	if !errors.Is(err, ErrCannotRun) || !strings.Contains(err.Error(), "the key does not open the stored secrets") {
		t.Fatalf("cause %v", err)
	}
	r.sup.stopAll()
	if runs := r.runs("config"); len(runs) != 1 {
		t.Fatalf("restarted: %v", runs)
	}
}

// A stop that comes while a crashed process waits out its backoff starts
// nothing: once stopAll returns, no goroutine of the supervisor is left
// that could, and the only run ever started is gone.
func TestStopDuringBackoffLeavesNoOrphan(t *testing.T) {
	r := newRig(t, 0)
	r.sup.minBackoff = time.Hour
	p := r.proc("crasher", "crash")
	if err := r.sup.start(p, noStop); err != nil {
		t.Fatal(err)
	}
	r.eventually(10*time.Second, func() error {
		if r.logs.FilterMessage("process exited, restarting").Len() == 0 {
			return errors.New("not in backoff yet")
		}
		return nil
	})
	done := make(chan struct{})
	go func() { r.sup.stopAll(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stopAll waited out the backoff")
	}
	if runs := r.runs("crasher"); len(runs) != 1 || alive(runs[0].pid) {
		t.Fatalf("runs after the stop: %v", runs)
	}
}

// A stop that lands between a backoff and the restart it ends: the
// restart does not happen (a child started then would outlive the stack).
func TestStopBetweenBackoffAndRestart(t *testing.T) {
	r := newRig(t, 0)
	r.sup.minBackoff = time.Millisecond
	stopped := make(chan struct{})
	var once sync.Once
	r.sup.beforeRespawn = func() {
		once.Do(func() {
			go func() { r.sup.stopAll(); close(stopped) }()
			// Hold the restart until the stop has begun. Not r.eventually:
			// this runs on the supervisor's goroutine, where t.Fatal must
			// not.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				r.sup.mu.Lock()
				begun := r.sup.stopping
				r.sup.mu.Unlock()
				if begun {
					return
				}
				if time.Now().After(deadline) {
					t.Error("the stop had not begun after 10 s")
					return
				}
			}
		})
	}
	p := r.proc("crasher", "crash")
	if err := r.sup.start(p, noStop); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, stopped)
	runs := r.runs("crasher")
	for _, run := range runs {
		if alive(run.pid) {
			_ = syscall.Kill(run.pid, syscall.SIGKILL)
			t.Fatalf("run %d outlived stopAll (runs %v)", run.pid, runs)
		}
	}
	if len(runs) != 1 {
		t.Fatalf("restarted during the stop: %v", runs)
	}
}

// Stops racing restarts: a process that lives a few milliseconds and is
// restarted after one is stopped at random moments, over and over. Every
// run it ever started is gone once stopAll returns.
func TestStopRacingRestartsNeverOrphans(t *testing.T) {
	for i := range 25 {
		r := newRig(t, 0)
		r.sup.minBackoff, r.sup.maxBackoff = time.Millisecond, time.Millisecond
		name := "flapper" + strconv.Itoa(i)
		p := r.proc(name, "crash", "FAKE_LIFE=3ms")
		if err := r.sup.start(p, noStop); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		r.sup.stopAll()
		for _, run := range r.runs(name) {
			if alive(run.pid) {
				_ = syscall.Kill(run.pid, syscall.SIGKILL)
				t.Fatalf("iteration %d: run %d outlived stopAll", i, run.pid)
			}
		}
	}
}

// A process that stops answering its health check (SIGSTOP) is killed
// once the liveness limit passes, and restarted; a process still starting
// (never answered yet) is left alone.
func TestLivenessRestartsAHungProcess(t *testing.T) {
	r := newRig(t, time.Second)
	r.sup.probeEvery = 100 * time.Millisecond
	r.sup.minBackoff = 10 * time.Millisecond
	hung := r.proc("hung", "serve")
	slow := r.proc("slow", "slowstart", "FAKE_LIFE=2s")
	for _, p := range []*proc{hung, slow} {
		if err := r.sup.start(p, noStop); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := r.sup.waitReady(ctx, 30*time.Second, []*proc{hung}); err != nil {
		t.Fatal(err)
	}
	first := r.runs("hung")[0].pid
	if err := syscall.Kill(first, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	r.eventually(15*time.Second, func() error {
		if runs := r.runs("hung"); len(runs) < 2 {
			return fmt.Errorf("not restarted: %v", runs)
		}
		return nil
	})
	t.Logf("hung process replaced %v after SIGSTOP (liveness 1s)", time.Since(stopped).Round(time.Millisecond))
	if alive(first) {
		t.Fatal("the hung run is still there")
	}
	if r.logs.FilterMessage("process not answering its health check, killing it").FilterField(zap.String("child", "hung")).Len() != 1 {
		t.Fatal("the kill was not logged")
	}
	if err := r.sup.waitReady(ctx, 30*time.Second, []*proc{hung, slow}); err != nil {
		t.Fatal(err)
	}
	if runs := r.runs("slow"); len(runs) != 1 {
		t.Fatalf("a process still starting was killed: %v", runs)
	}
}

// While the start waits, the launcher says every few seconds what for
// and why; a process that never serves fails the start naming the reason
// its health gives, one that exits fails it at once with the last line of
// its log; an interrupt ends the wait with its cause.
func TestWaitReadySaysWhatItWaitsFor(t *testing.T) {
	r := newRig(t, 0)
	r.sup.waitLogEvery = 200 * time.Millisecond
	down := r.proc("needsdb", "notserving", "FAKE_MESSAGE=connection refused")
	if err := r.sup.start(down, noStop); err != nil {
		t.Fatal(err)
	}
	err := r.sup.waitReady(context.Background(), 1500*time.Millisecond, []*proc{down})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "database: connection refused") {
		t.Fatalf("never serving: %v", err)
	}
	waits := r.logs.FilterMessage("waiting for processes to become ready").All()
	if len(waits) < 2 {
		t.Fatalf("%d waiting lines", len(waits))
	}
	// The first line may come before the process has its socket (a
	// loaded machine starts it late); a later one must give its reason.
	said := false
	for _, w := range waits {
		said = said || strings.Contains(fmt.Sprint(w.ContextMap()["needsdb"]), "not serving: database: connection refused")
	}
	if !said {
		t.Fatalf("no waiting line gives the reason: %v", waits[len(waits)-1].ContextMap())
	}

	dies := r.proc("dies", "crash", "FAKE_MESSAGE=fatal: the key does not open the stored secrets")
	if err := r.sup.start(dies, noStop); err != nil {
		t.Fatal(err)
	}
	err = r.sup.waitReady(context.Background(), time.Minute, []*proc{dies})
	if err == nil || !strings.Contains(err.Error(), "dies exited during start") || !strings.Contains(err.Error(), "fatal: the key does not open") {
		t.Fatalf("exit during start: %v", err)
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	interrupted := errors.New("interrupt")
	time.AfterFunc(300*time.Millisecond, func() { cancel(interrupted) })
	if err := r.sup.waitReady(ctx, time.Minute, []*proc{down}); !errors.Is(err, interrupted) {
		t.Fatalf("interrupted wait: %v", err)
	}
}

// A process's log is kept in its bound however much its runs write (each
// run here writes ten times the bound and crashes), in whole lines, and
// what a run wrote last, the reason a permanent failure gives, is in it
// when the exit is seen.
func TestProcessLogsStayInTheirBound(t *testing.T) {
	r := newRig(t, 0)
	r.sup.minBackoff, r.sup.maxBackoff = time.Millisecond, 5*time.Millisecond
	r.sup.maxLog = 64 << 10
	p := r.proc("chatty", "crash", fmt.Sprintf("FAKE_SPAM=%d", 10*r.sup.maxLog), "FAKE_MESSAGE=chatty: about to fail")
	if err := r.sup.start(p, noStop); err != nil {
		t.Fatal(err)
	}
	r.eventually(20*time.Second, func() error {
		if n := len(r.runs("chatty")); n < 4 {
			return fmt.Errorf("%d runs", n)
		}
		return nil
	})
	r.sup.stopAll()
	path := filepath.Join(r.dir, "chatty.log")
	var total int64
	for _, name := range []string{path, path + ".old"} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > r.sup.maxLog+100 {
			t.Errorf("%s holds %d bytes, bound %d", filepath.Base(name), fi.Size(), r.sup.maxLog)
		}
		total += fi.Size()
	}
	runs := len(r.runs("chatty"))
	if entries, _ := filepath.Glob(path + "*"); len(entries) != 2 {
		t.Errorf("log files %v", entries)
	}
	t.Logf("%d runs wrote %d bytes; %d kept", runs, int64(runs)*10*r.sup.maxLog, total)
	// Every line kept is whole.
	for _, name := range []string{path, path + ".old"} {
		raw, _ := os.ReadFile(name)
		for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
			if len(line) != 99 && line != "chatty: about to fail" {
				t.Fatalf("%s: a line cut: %q", filepath.Base(name), line)
			}
		}
	}

	// The permanent failure's reason is read from the log as the exit is
	// seen, after a run wrote past the bound.
	r2 := newRig(t, 0)
	r2.sup.maxLog = 64 << 10
	p2 := r2.proc("config", "crash", fmt.Sprintf("FAKE_SPAM=%d", 3*r2.sup.maxLog), "FAKE_CODE=78", "FAKE_MESSAGE=config: cannot run")
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	if err := r2.sup.start(p2, stop); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stack was not stopped")
	}
	if err := context.Cause(ctx); !strings.Contains(err.Error(), "config: cannot run") {
		t.Fatalf("cause %v", err)
	}
}

// A run that dies leaves nothing it started running: its process group
// is killed once it has exited. A PostgreSQL killed outright during its
// crash recovery left its startup process holding the cluster's shared
// memory, and every restart refused to run ("pre-existing shared memory
// block is still in use") until that process gave up, a minute later.
func TestExitedRunLeavesNothingRunning(t *testing.T) {
	r := newRig(t, 0)
	r.sup.minBackoff = 50 * time.Millisecond
	childFile := filepath.Join(r.dir, "child")
	p := &proc{name: "server", command: func() *exec.Cmd {
		// Its child is in its process group, as a postmaster's are.
		cmd := exec.Command("sh", "-c", `sleep 300 & echo $! > "$0"; exec sleep 300`, childFile)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}}
	if err := r.sup.start(p, noStop); err != nil {
		t.Fatal(err)
	}
	var child int
	r.eventually(10*time.Second, func() error {
		raw, err := os.ReadFile(childFile)
		if err == nil {
			child, err = strconv.Atoi(strings.TrimSpace(string(raw)))
		}
		return err
	})
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if err := p.current().cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	r.eventually(10*time.Second, func() error {
		if running(child) {
			return fmt.Errorf("the child %d of the killed run still runs", child)
		}
		return nil
	})
}

// running reports whether pid is a process that has not exited (a
// zombie has: nothing may reap it here).
func running(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// The readiness bound measures a stall, not the start's whole work: a
// process whose health says a new step of its start (replicas of the
// plugin sandbox compiling their plugins on a busy machine) is waited
// for past the bound, one that stays at a step fails it, and so does one
// that steps for ever, at readyProgressCap times the bound.
func TestWaitReadyWaitsForAStartThatProgresses(t *testing.T) {
	r := newRig(t, 0)
	// Twenty steps of 250 ms: 5 s in all against a bound of 3 s, each
	// step well inside it.
	slow := r.proc("compiling", "steps", "FAKE_STEPS=20", "FAKE_LIFE=250ms")
	if err := r.sup.start(slow, noStop); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := r.sup.waitReady(context.Background(), 3*time.Second, []*proc{slow}); err != nil {
		t.Fatalf("a start that progresses, after %v: %v", time.Since(began).Round(time.Millisecond), err)
	}
	if took := time.Since(began); took < 3*time.Second {
		t.Fatalf("the steps took %v: not past the bound, the test proves nothing", took)
	}

	stuck := r.proc("stuck", "steps", "FAKE_STEPS=12", "FAKE_LIFE=100ms", "FAKE_HANG=3")
	if err := r.sup.start(stuck, noStop); err != nil {
		t.Fatal(err)
	}
	err := r.sup.waitReady(context.Background(), 3*time.Second, []*proc{stuck})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no progress for") || !strings.Contains(err.Error(), "starting: step 3") {
		t.Fatalf("a start stuck at its third step: %v", err)
	}

	defer func(c time.Duration) { readyProgressCap = c }(readyProgressCap)
	readyProgressCap = 3
	endless := r.proc("endless", "steps", "FAKE_STEPS=-1", "FAKE_LIFE=100ms")
	if err := r.sup.start(endless, noStop); err != nil {
		t.Fatal(err)
	}
	err = r.sup.waitReady(context.Background(), 2*time.Second, []*proc{endless})
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "still starting after") {
		t.Fatalf("a start stepping for ever: %v", err)
	}
}
