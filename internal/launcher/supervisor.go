package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/graceful"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/service"
)

// Defaults of the supervisor (Config may change the liveness limit).
const (
	// minBackoff and maxBackoff bound the restart delay, which doubles
	// from one to the other; a run that lasted healthyRun starts again
	// from minBackoff.
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
	healthyRun = 30 * time.Second
	// stopGrace is how long a process may take to exit after its stop
	// signal before it is killed; it covers the services' own drain limit.
	stopGrace = 15 * time.Second
	// DefaultLiveness is how long a process may leave its health check
	// unanswered before it is killed and restarted.
	DefaultLiveness = 10 * time.Second
	// probeEvery is how often the liveness of each process is asked.
	probeEvery = time.Second
	// waitLogEvery is how often a start that waits says what for.
	waitLogEvery = 3 * time.Second
	// readyTick is how often waitReady asks a process that does not
	// notify (PostgreSQL: a connection attempt on a local socket).
	readyTick = 10 * time.Millisecond
)

// readyProgressCap bounds a start that keeps progressing: at most this
// many times the readiness bound (waitReadyTold), ten minutes by
// default, so that a process whose reason changes for ever (a dependency's
// error naming a new port each time) still fails the start.
var readyProgressCap time.Duration = 10

// prober asks a process whether it is alive and ready.
type prober interface {
	// probe reports answered when the process replied at all (it is
	// alive), and err nil when it is ready (serving, accepting), else why
	// not.
	probe(ctx context.Context) (answered bool, err error)
	close()
}

// watcher is a prober that can tell, without being asked, when its
// process's readiness may have changed: waitReady then probes at once
// instead of at its next tick.
type watcher interface {
	// watch calls changed each time the readiness may have changed, until
	// ctx ends.
	watch(ctx context.Context, changed func())
}

// proc is one supervised process.
type proc struct {
	name string
	// command makes the command of a new run; started, when set, is
	// called once its Start has returned (the launcher closes its copies
	// of what it handed the first run only).
	command func() *exec.Cmd
	started func()
	// served, when set, is called once a run has served (the start's
	// readiness): the config process's later runs are not given the
	// --set overrides.
	served func()
	// stopSignal asks the process to stop (SIGTERM; PostgreSQL's fast
	// shutdown is SIGINT).
	stopSignal syscall.Signal
	probe      prober
	// gateway, with ephemeral: a clean exit stops the stack.
	gateway, ephemeral bool
	// log is the process's log file, shared by its runs (logfile.go).
	log *logFile

	mu       sync.Mutex
	run      *run
	restarts int
	// supervised is closed when the process's supervise loop has
	// returned: nothing starts it again after that.
	supervised chan struct{}
}

// run is one execution of a process.
type run struct {
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed once cmd.Wait returned
	// answered is when the run last answered a probe (unix ns; 0: never).
	answered atomic.Int64
}

// probe asks p's process, recording when this run answered.
func (r *run) probe(ctx context.Context, p *proc) (bool, error) {
	answered, err := p.probe.probe(ctx)
	if answered {
		r.answered.Store(time.Now().UnixNano())
	}
	return answered, err
}

func (r *run) lastAnswer() time.Time {
	ns := r.answered.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func (p *proc) current() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.run
}

// supervisor starts processes, restarts them when they exit or stop
// answering their health check, and stops them. Every goroutine it starts
// is counted in wg and awaited by stopAll.
type supervisor struct {
	log      *zap.Logger
	logDir   string
	liveness time.Duration // 0: no liveness probing
	// onRestart is told of each restart (the launcher publishes it).
	onRestart func(name string, restarts int)
	// onUpgrade, when set, is told of each schema upgrade a run's output
	// reports (upgraded.go). Set before the first start, never after.
	onUpgrade func(schema, from, to string)
	// tunables, set by newSupervisor; tests shorten them.
	minBackoff, maxBackoff, healthyRun, probeEvery, waitLogEvery, stopGrace time.Duration
	// maxLog is the size at which a process's log is rotated.
	maxLog int64
	// states, when set, is told of each process's changes of state
	// (procstate.go). Set before the first start, never after.
	states *procStates
	// beforeRespawn, when set, runs after a backoff, right before the
	// restart: tests stop the supervisor there.
	beforeRespawn func()

	// ctx is the supervision: cancelled first thing by stopAll, so no
	// loop starts anything afterwards.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	procs    []*proc
	stopping bool
}

func newSupervisor(log *zap.Logger, logDir string, liveness time.Duration) *supervisor {
	ctx, cancel := context.WithCancel(context.Background())
	return &supervisor{
		log: log, logDir: logDir, liveness: liveness, onRestart: func(string, int) {},
		minBackoff: minBackoff, maxBackoff: maxBackoff, healthyRun: healthyRun,
		probeEvery: probeEvery, waitLogEvery: waitLogEvery, stopGrace: stopGrace,
		maxLog: maxLogBytes, ctx: ctx, cancel: cancel,
	}
}

// errStopping: the supervisor is stopping and starts nothing.
var errStopping = errors.New("supervisor stopping")

// start runs p and keeps it running until stopAll. stop is called with
// ErrEphemeralDone when an ephemeral gateway exits cleanly.
func (s *supervisor) start(p *proc, stop context.CancelCauseFunc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errStopping
	}
	if p.stopSignal == 0 {
		p.stopSignal = syscall.SIGTERM
	}
	lf, err := openLog(s.logPath(p), s.maxLog)
	if err != nil {
		return fmt.Errorf("%s log: %w", p.name, err)
	}
	p.log = lf
	if err := s.spawn(p); err != nil {
		lf.Close()
		return err
	}
	p.supervised = make(chan struct{})
	s.procs = append(s.procs, p)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(p.supervised)
		s.supervise(p, stop)
	}()
	return nil
}

func (s *supervisor) logPath(p *proc) string { return filepath.Join(s.logDir, p.name+".log") }

// spawn starts a new run of p, its output copied into p's log, with its
// own goroutines waiting for it and copying.
func (s *supervisor) spawn(p *proc) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("%s log: %w", p.name, err)
	}
	cmd := p.command()
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close() // the run holds its own copy
	if p.started != nil {
		p.started()
	}
	if err != nil {
		pr.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	r := &run{cmd: cmd, started: time.Now(), exited: make(chan struct{})}
	p.mu.Lock()
	p.run = r
	p.mu.Unlock()
	var watch *upgradeWatch
	if s.onUpgrade != nil {
		watch = &upgradeWatch{seen: s.onUpgrade}
	}
	copied := make(chan struct{})
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer close(copied)
		copyLog(pr, p.log, func(err error) {
			s.log.Warn("process log not written, its lines dropped", zap.String("child", p.name), zap.Error(err))
		}, watch)
	}()
	go func() {
		defer s.wg.Done()
		_ = cmd.Wait()
		// Nothing the run started outlives it: every process leads its
		// own group (Setpgid), which its children share. A PostgreSQL
		// killed outright during its crash recovery left its startup
		// process holding the cluster's shared memory, and each restart
		// refused to run ("pre-existing shared memory block is still in
		// use") until that process gave up, a minute later.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		// The run's last lines are in its log before the exit is seen
		// (lastLine reads them). A process of its own that outlives it
		// (a PostgreSQL backend) may keep the pipe open: its lines are
		// dropped after logDrainGrace.
		select {
		case <-copied:
		case <-time.After(logDrainGrace):
		}
		pr.Close()
		<-copied
		close(r.exited)
	}()
	s.states.started(p.name, cmd.Process.Pid)
	s.log.Info("process started", zap.String("child", p.name), zap.Int("pid", cmd.Process.Pid))
	return nil
}

// supervise restarts p each time its run exits, with backoff, until the
// supervision ends. The context is checked after every wait, so a stop
// that comes during a backoff starts nothing.
func (s *supervisor) supervise(p *proc, stop context.CancelCauseFunc) {
	backoff := s.minBackoff
	for {
		r := p.current()
		s.watchLiveness(p, r)
		select {
		case <-r.exited:
		case <-s.ctx.Done():
			return
		}
		if s.ctx.Err() != nil {
			return
		}
		code := r.cmd.ProcessState.ExitCode()
		if p.gateway && p.ephemeral && code == 0 {
			s.log.Info("ephemeral gateway exited, stopping the stack")
			stop(ErrEphemeralDone)
			return
		}
		if code == service.ExitPermanent {
			why := lastLine(s.logPath(p))
			s.log.Error("process cannot run as configured, stopping the stack", zap.String("child", p.name), zap.String("why", why))
			stop(fmt.Errorf("%w: %s: %s (see %s)", ErrCannotRun, p.name, why, s.logPath(p)))
			return
		}
		if time.Since(r.started) > s.healthyRun {
			backoff = s.minBackoff
		}
		p.mu.Lock()
		p.restarts++
		restarts := p.restarts
		p.mu.Unlock()
		s.log.Warn("process exited, restarting", zap.String("child", p.name), zap.Int("exit_code", code),
			zap.String("state", r.cmd.ProcessState.String()), zap.Int("restarts", restarts), zap.Duration("backoff", backoff))
		s.states.exited(p.name, restarts, r.cmd.ProcessState.String(), backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(backoff*2, s.maxBackoff)
		if s.beforeRespawn != nil {
			s.beforeRespawn()
		}
		if err := s.respawn(p); err != nil {
			if errors.Is(err, errStopping) {
				return
			}
			s.log.Error("restart failed", zap.String("child", p.name), zap.Error(err))
			continue
		}
		s.onRestart(p.name, restarts)
	}
}

// respawn starts p again unless the supervisor is stopping: under the
// lock stopAll takes first, so a run either starts before the stop (and
// is stopped by it) or not at all.
func (s *supervisor) respawn(p *proc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errStopping
	}
	return s.spawn(p)
}

// watchLiveness asks r's process for its health every probeEvery, on a
// goroutine of its own, until the run exits; once the process has
// answered, a silence of s.liveness gets it killed, and supervise
// restarts it. A process that has never answered is still starting:
// its own start limits apply.
func (s *supervisor) watchLiveness(p *proc, r *run) {
	if s.liveness <= 0 || p.probe == nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(s.probeEvery)
		defer t.Stop()
		for {
			select {
			case <-r.exited:
				return
			case <-s.ctx.Done():
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(s.ctx, s.probeEvery)
			answered, err := r.probe(ctx, p)
			cancel()
			now := time.Now()
			last := r.lastAnswer()
			s.states.answered(p.name, r.cmd.Process.Pid, answered, last)
			if last.IsZero() || now.Sub(last) < s.liveness || s.ctx.Err() != nil {
				continue
			}
			s.log.Warn("process not answering its health check, killing it", zap.String("child", p.name),
				zap.Int("pid", r.cmd.Process.Pid), zap.Duration("silent_for", now.Sub(last).Round(time.Millisecond)),
				zap.Duration("liveness", s.liveness), zap.Error(err))
			graceful.KillTree(r.cmd.Process.Pid)
			return
		}
	}()
}

// stopAll ends supervision, waits for every supervise loop (so no
// process can be started behind its back), then stops every process in
// reverse start order: its stop signal, then SIGKILL after the grace.
// It returns once every goroutine of the supervisor has. Safe to call
// twice.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	s.stopping = true
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	s.cancel()
	for _, p := range procs {
		<-p.supervised
	}
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		r := p.current()
		select {
		case <-r.exited:
			continue
		default:
		}
		if graceful.Stop(r.cmd.Process, r.exited, p.stopSignal, s.stopGrace) {
			s.log.Warn("process did not stop in time, killed", zap.String("child", p.name))
		} else {
			s.log.Info("process stopped", zap.String("child", p.name))
		}
	}
	s.wg.Wait()
	for _, p := range procs {
		if p.probe != nil {
			p.probe.close()
		}
		p.log.Close()
	}
}

// waitReady waits until every process is ready (its probe says so),
// saying every waitLogEvery which ones it still waits for and why. It
// fails at once when a process exits, with the last line of its log, and
// after limit with ErrNotReady; when ctx ends first it returns ctx's
// cause.
func (s *supervisor) waitReady(ctx context.Context, limit time.Duration, procs []*proc) error {
	return s.waitReadyTold(ctx, limit, procs, nil)
}

// waitReadyTold is waitReady that calls answered (when not nil) once
// for each process, the first time it answers a probe, ready or not.
//
// limit bounds a wait without progress, not the whole wait: a process
// whose health gives a new reason (a step of its start: "connecting to
// the bus", "compiling plugin echo (tool world)") has progressed, and
// the wait for every process of procs goes on for limit from there, up
// to readyProgressCap times limit in all. Replicas of the plugin sandbox
// starting together on a busy machine spent the whole minute compiling
// their plugins, each step in turn, and the start failed; one waiting
// for another's compile progresses when that one does.
func (s *supervisor) waitReadyTold(ctx context.Context, limit time.Duration, procs []*proc, answered func(*proc)) error {
	start := time.Now()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	lastProgress := start
	total := start.Add(limit * readyProgressCap)
	said := make(map[*proc]string, len(procs)) // the last reason each answered
	// gRPC processes notify (their health Watch stream); the tick is for
	// the others (PostgreSQL) and a fallback.
	tick := time.NewTicker(readyTick)
	defer tick.Stop()
	kick := make(chan struct{}, 1)
	watchCtx, stopWatching := context.WithCancel(ctx)
	var watching sync.WaitGroup
	defer func() { stopWatching(); watching.Wait() }()
	for _, p := range procs {
		if w, ok := p.probe.(watcher); ok {
			watching.Add(1)
			go func() {
				defer watching.Done()
				w.watch(watchCtx, func() {
					select {
					case kick <- struct{}{}:
					default:
					}
				})
			}()
		}
	}
	lastLog := start
	pending := append([]*proc(nil), procs...)
	why := make(map[*proc]error, len(procs))
	told := make(map[*proc]bool, len(procs))
	for {
		var still []*proc
		progressed := false
		for _, p := range pending {
			r := p.current()
			select {
			case <-r.exited:
				err := fmt.Errorf("%s exited during start (%s): %s; see %s", p.name, r.cmd.ProcessState,
					lastLine(s.logPath(p)), s.logPath(p))
				return s.stillWaiting(err, p, pending, why)
			default:
			}
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			replied, err := r.probe(pctx, p)
			cancel()
			if replied && answered != nil && !told[p] {
				told[p] = true
				answered(p)
			}
			if err != nil {
				why[p] = err
				still = append(still, p)
				if replied && said[p] != err.Error() {
					said[p] = err.Error()
					progressed = true
				}
			}
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		if progressed {
			if now := time.Now(); now.Before(total) {
				lastProgress = now
				deadline.Reset(min(limit, total.Sub(now)))
			}
		}
		if time.Since(lastLog) >= s.waitLogEvery {
			lastLog = time.Now()
			names := make([]string, len(pending))
			fields := []zap.Field{zap.Duration("waited", time.Since(start).Round(time.Second))}
			for i, p := range pending {
				names[i] = p.name
				fields = append(fields, zap.String(p.name, why[p].Error()))
			}
			s.log.Info("waiting for processes to become ready", append(fields, zap.Strings("waiting_for", names))...)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			// Said as a stall or as the cap on a start that kept
			// progressing; the bound is --ready-timeout either way.
			after := fmt.Sprintf("no progress for %v (%v since the wait began; --ready-timeout)",
				time.Since(lastProgress).Round(time.Second), time.Since(start).Round(time.Second))
			if !time.Now().Before(total) {
				after = fmt.Sprintf("still starting after %v, %d times --ready-timeout (%v)",
					time.Since(start).Round(time.Second), readyProgressCap, limit)
			}
			var errs []error
			for _, p := range pending {
				errs = append(errs, fmt.Errorf("%w: %s: %s: %w (see %s)", ErrNotReady, p.name, after, why[p], s.logPath(p)))
			}
			return errors.Join(errs...)
		case <-tick.C:
		case <-kick:
		}
	}
}

// stillWaiting adds to the exit during start of p the processes that were
// not ready yet, each with the last line of its log. A process often dies
// at start for want of another one still starting (plugin-sandbox that
// could not read the config, config waiting for an unreachable
// database), and what that one waits for is in its log only: it answers
// no health check meanwhile.
func (s *supervisor) stillWaiting(err error, p *proc, pending []*proc, why map[*proc]error) error {
	var others []string
	for _, o := range pending {
		if o != p && why[o] != nil {
			others = append(others, fmt.Sprintf("%s (not ready) last logged: %s", o.name, lastLine(s.logPath(o))))
		}
	}
	if len(others) == 0 {
		return err
	}
	return fmt.Errorf("%w; meanwhile %s", err, strings.Join(others, "; "))
}

// lastLine is the last non-empty line of a log file (a process that fails
// at start says why there), at most 400 bytes of it.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "no log"
	}
	defer f.Close()
	const tail = 8192
	fi, err := f.Stat()
	if err != nil {
		return "no log"
	}
	off := max(fi.Size()-tail, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return "no log"
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if len(last) > 400 {
		last = last[:400] + "…"
	}
	if last == "" {
		return "no output"
	}
	return last
}

// childEnv is the launcher's environment without what must not pass to
// every child: a bus credential given to the launcher is the launcher's
// own, and each child connects with its role's seed from the data
// directory; descriptors passed to the launcher are its own too, and a
// child is passed only the sockets plan hands it; so are --set overrides
// in its environment, which the config service would join to the ones
// plan passes.
func childEnv(env []string) []string {
	env = listenfd.Without(env)
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, bus.EnvSeed+"=") || strings.HasPrefix(kv, bus.EnvSeedFile+"=") || service.IsStartupSets(kv) {
			continue
		}
		out = append(out, kv)
	}
	return out
}
