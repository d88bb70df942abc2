// Package launcher is `clawmesh up`: it brings the whole suite up on one
// host (PostgreSQL, NATS, the services, then the gateway), supervises it,
// restarting a crashed process with backoff, and stops it in reverse order.
package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/natsembed"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/service"
	"github.com/clawmesh/clawmesh/internal/stack"
)

// Errors the launcher reports.
var (
	// ErrAlreadyRunning: another launcher holds the data directory's lock.
	ErrAlreadyRunning = errors.New("another clawmesh stack is already running on this data directory")
	// ErrEphemeralDone: ephemeral mode, the last client left.
	ErrEphemeralDone = errors.New("ephemeral stack: last client disconnected")
	// ErrNotReady: a process did not become healthy in time.
	ErrNotReady = errors.New("process did not become healthy")
)

// Config is the launcher's configuration.
type Config struct {
	DataDir string
	// BinDir holds the service binaries; default: beside this executable.
	BinDir string
	// DatabaseURL and NATSURL select external servers; empty starts a
	// private cluster and an embedded server.
	DatabaseURL, NATSURL string
	// Sets are config properties prop=value committed at start.
	Sets []string
	// Scale maps a scalable process to its replica count.
	Scale map[string]int
	// Ephemeral stops the stack 1 s after the last client leaves.
	Ephemeral bool
	// ReadyTimeout bounds the wait for each process's health.
	ReadyTimeout time.Duration
	// Out receives the human-readable lines (socket path).
	Out io.Writer
	Log *zap.Logger
}

func (c *Config) withDefaults() error {
	if c.DataDir == "" {
		return errors.New("launcher: data directory required")
	}
	if c.BinDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find binaries: %w", err)
		}
		c.BinDir = filepath.Dir(exe)
	}
	for name, n := range c.Scale {
		if p, ok := stack.Lookup(name); !ok || !p.Scalable {
			return fmt.Errorf("--scale %s: only %s runs several replicas", name, scalable())
		}
		if n < 1 || n > 64 {
			return fmt.Errorf("--scale %s=%d: replicas must be between 1 and 64", name, n)
		}
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 60 * time.Second
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	return nil
}

// Run starts the stack and supervises it until ctx is done (a requested
// stop: nil) or, in ephemeral mode, the last client left
// (ErrEphemeralDone). Everything it started is stopped before it returns.
func Run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.withDefaults(); err != nil {
		return err
	}
	log := cfg.Log
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	// The client socket lives here: the folder must be the owner's alone.
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	unlock, err := lock(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()

	var stack []func() // stoppers, run in reverse
	defer func() {
		for i := len(stack) - 1; i >= 0; i-- {
			stack[i]()
		}
	}()

	logDir := filepath.Join(cfg.DataDir, "logs")
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return fmt.Errorf("log folder: %w", err)
	}
	dbURL := cfg.DatabaseURL
	if dbURL == "" {
		dir := pgcluster.Dir(cfg.DataDir)
		log.Info("starting private postgres", zap.String("dir", dir))
		pgLog, err := os.OpenFile(filepath.Join(logDir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("postgres log: %w", err)
		}
		defer pgLog.Close()
		cl, err := pgcluster.Start(ctx, pgcluster.Options{Dir: dir, Log: log, Output: pgLog})
		if err != nil {
			return fmt.Errorf("postgres (see %s): %w", pgLog.Name(), err)
		}
		stack = append(stack, cl.Stop)
		dbURL = cl.URL()
	}
	// Every process connects to the bus under its own identity: the seeds
	// live 0600 in the data directory, the embedded server knows the
	// public keys (an external NATS_URL server is given them by its
	// operator: clawmesh bus users prints them).
	keys, err := bus.EnsureCredentials(cfg.DataDir)
	if err != nil {
		return err
	}
	natsURL := cfg.NATSURL
	if natsURL == "" {
		ns, err := natsembed.Run(keys, log)
		if err != nil {
			return err
		}
		stack = append(stack, ns.Shutdown)
		natsURL = ns.URL()
	}
	seed, err := bus.LoadSeed(cfg.DataDir, bus.RoleLauncher)
	if err != nil {
		return err
	}
	nc, err := natsutil.Connect(natsutil.Options{URL: natsURL, Name: "clawmesh-launcher", Seed: seed,
		InboxPrefix: bus.RoleLauncher.InboxPrefix(), Log: log})
	if err != nil {
		return err
	}
	stack = append(stack, nc.Close)

	sup := &supervisor{log: log, nc: nc, logDir: logDir, readyTimeout: cfg.ReadyTimeout}
	procs, err := plan(cfg, dbURL, natsURL)
	if err != nil {
		return err
	}
	stopCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	stack = append(stack, sup.stopAll)

	// Services start together; the gateway only once they all serve.
	services, gateway := procs[:len(procs)-1], procs[len(procs)-1]
	for _, p := range services {
		if err := sup.start(stopCtx, p, stop); err != nil {
			return err
		}
	}
	if err := sup.waitHealthy(ctx, services); err != nil {
		return err
	}
	if err := sup.start(stopCtx, gateway, stop); err != nil {
		return err
	}
	if err := sup.waitHealthy(ctx, []*proc{gateway}); err != nil {
		return err
	}
	socket := datadir.Socket(cfg.DataDir)
	fmt.Fprintf(cfg.Out, "clawmesh %s is up\nsocket: %s\n", cfg.DataDir, socket)
	log.Info("stack up", zap.String("socket", socket), zap.String("data_dir", cfg.DataDir))

	<-stopCtx.Done()
	cause := context.Cause(stopCtx)
	log.Info("stopping stack", zap.NamedError("cause", cause))
	if errors.Is(cause, ErrEphemeralDone) {
		return ErrEphemeralDone
	}
	return nil
}

// Environment a child gets besides the launcher's own: secrets travel
// here, never on a command line another user can read in ps.
const (
	// envSets holds the --set overrides for the config service, a JSON
	// array of "prop=value" strings.
	envSets = "CLAWMESH_STARTUP_SETS"
)

// plan lists the processes with their arguments and environment, in the
// stack table's order (gateway last).
func plan(cfg Config, dbURL, natsURL string) ([]*proc, error) {
	common := []string{"--config-dir", cfg.DataDir, "--nats-url", natsURL}
	env := []string{service.EnvDatabaseURL + "=" + dbURL}
	var plugins []string
	for i := range max(cfg.Scale["plugin-sandbox"], 1) {
		plugins = append(plugins, datadir.ServiceSocket(cfg.DataDir, "plugin-sandbox", i))
	}
	peers := []string{"--plugin-addr", strings.Join(plugins, ",")}
	sets, err := json.Marshal(cfg.Sets)
	if err != nil {
		return nil, fmt.Errorf("--set values: %w", err)
	}
	var procs []*proc
	for _, sp := range stack.Processes {
		n := 1
		if sp.Scalable {
			n = max(cfg.Scale[sp.Name], 1)
		}
		for i := range n {
			name := sp.Name
			if i > 0 {
				name += "." + strconv.Itoa(i)
			}
			sock := datadir.ServiceSocket(cfg.DataDir, sp.Name, i)
			args := append(append(append([]string{}, common...), "--listen", sock), peers...)
			penv := append([]string{}, env...)
			if sp.Role == bus.RoleConfig && len(cfg.Sets) > 0 {
				penv = append(penv, envSets+"="+string(sets))
			}
			if sp.Edge && cfg.Ephemeral {
				args = append(args, "--ephemeral")
			}
			procs = append(procs, &proc{
				name: name, bin: filepath.Join(cfg.BinDir, sp.Name), args: args, env: penv, health: sock,
				gateway: sp.Edge, ephemeral: sp.Edge && cfg.Ephemeral,
			})
		}
	}
	return procs, nil
}

func scalable() string {
	var names []string
	for _, p := range stack.Processes {
		if p.Scalable {
			names = append(names, p.Name)
		}
	}
	return strings.Join(names, ", ")
}

// lock takes the data directory's lock, so a second stack on the same
// directory refuses to start instead of fighting over its sockets.
func lock(dir string) (func(), error) {
	path := datadir.LockFile(dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s, launcher pid %s); stop it first or use another --config-dir",
				ErrAlreadyRunning, dir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		_ = f.Truncate(0)
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// publishRestart tells the gateway a process was restarted.
func publishRestart(nc *nats.Conn, name string, count int) {
	_ = bus.PublishRestart(nc, name, count)
}
