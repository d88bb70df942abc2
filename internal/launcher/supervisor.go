package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"strings"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/graceful"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
)

// Restart backoff: doubling from minBackoff to maxBackoff; a process that
// ran healthyRun without crashing starts again from minBackoff.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
	healthyRun = 30 * time.Second
	// stopGrace is how long a process may take to exit after SIGTERM
	// before it is killed; it covers the services' own drain limit.
	stopGrace = 15 * time.Second
)

// proc is one supervised process.
type proc struct {
	name, bin string
	args      []string
	env       []string // added to the launcher's environment
	health    string   // gRPC health socket
	gateway   bool
	ephemeral bool

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the current run has exited
	restarts int
	stopped  chan struct{} // closed when supervision has ended
}

type supervisor struct {
	log          *zap.Logger
	nc           *nats.Conn
	logDir       string
	readyTimeout time.Duration

	mu       sync.Mutex
	procs    []*proc
	stopping bool
}

// start runs p and keeps it running until ctx is done. stop is called
// with ErrEphemeralDone when an ephemeral gateway exits cleanly.
func (s *supervisor) start(ctx context.Context, p *proc, stop context.CancelCauseFunc) error {
	if _, err := os.Stat(p.bin); err != nil {
		return fmt.Errorf("%s binary: %w (run make build)", p.name, err)
	}
	p.stopped = make(chan struct{})
	if err := s.spawn(p); err != nil {
		close(p.stopped)
		return err
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	go s.supervise(ctx, p, stop)
	return nil
}

func (s *supervisor) spawn(p *proc) error {
	logFile, err := os.OpenFile(filepath.Join(s.logDir, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%s log: %w", p.name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(childEnv(os.Environ()), p.env...)
	// Own process group: a terminal's Ctrl-C reaches only the launcher,
	// which then stops everything in order. Pdeathsig: a launcher killed
	// outright takes its children with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	s.log.Info("process started", zap.String("child", p.name), zap.Int("pid", cmd.Process.Pid))
	return nil
}

func (s *supervisor) supervise(ctx context.Context, p *proc, stop context.CancelCauseFunc) {
	defer close(p.stopped)
	backoff := minBackoff
	for {
		p.mu.Lock()
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		startedAt := time.Now()
		select {
		case <-exited:
		case <-ctx.Done():
			return
		}
		if s.isStopping() || ctx.Err() != nil {
			return
		}
		code := cmd.ProcessState.ExitCode()
		if p.gateway && p.ephemeral && code == 0 {
			s.log.Info("ephemeral gateway exited, stopping the stack")
			stop(ErrEphemeralDone)
			return
		}
		if time.Since(startedAt) > healthyRun {
			backoff = minBackoff
		}
		p.mu.Lock()
		p.restarts++
		restarts := p.restarts
		p.mu.Unlock()
		s.log.Warn("process exited, restarting", zap.String("child", p.name), zap.Int("exit_code", code),
			zap.String("state", cmd.ProcessState.String()), zap.Int("restarts", restarts), zap.Duration("backoff", backoff))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, maxBackoff)
		if s.isStopping() {
			return
		}
		if err := s.spawn(p); err != nil {
			s.log.Error("restart failed", zap.String("child", p.name), zap.Error(err))
			continue
		}
		publishRestart(s.nc, p.name, restarts)
	}
}

func (s *supervisor) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// stopAll stops every process in reverse start order: SIGTERM, then
// SIGKILL after stopGrace. Safe to call twice.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	s.stopping = true
	procs := append([]*proc(nil), s.procs...)
	s.procs = nil
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		p.mu.Lock()
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		select {
		case <-exited:
			continue
		default:
		}
		if graceful.Stop(cmd.Process, exited, syscall.SIGTERM, stopGrace) {
			s.log.Warn("process did not stop in time, killed", zap.String("child", p.name))
		} else {
			s.log.Info("process stopped", zap.String("child", p.name))
		}
	}
}

// waitHealthy waits until every process reports SERVING on its health
// socket, failing early when one exits.
func (s *supervisor) waitHealthy(ctx context.Context, procs []*proc) error {
	ctx, cancel := context.WithTimeout(ctx, s.readyTimeout)
	defer cancel()
	errc := make(chan error, len(procs))
	for _, p := range procs {
		go func() { errc <- s.waitOne(ctx, p) }()
	}
	var errs []error
	for range procs {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *supervisor) waitOne(ctx context.Context, p *proc) error {
	cc, err := grpcclient.Dial(p.health)
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	// The run being waited for: if it exits before it serves, the stack
	// does not come up (the supervisor's restart would only fail again).
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s exited during start; see %s", p.name, filepath.Join(s.logDir, p.name+".log"))
		default:
		}
		actx, acancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(actx, &healthpb.HealthCheckRequest{})
		acancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s (see %s)", ErrNotReady, p.name, filepath.Join(s.logDir, p.name+".log"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// childEnv is the launcher's environment without what must not pass to
// every child: a bus credential given to the launcher is the launcher's
// own, and each child connects with its role's seed from the data
// directory.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, bus.EnvSeed+"=") || strings.HasPrefix(kv, bus.EnvSeedFile+"=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
