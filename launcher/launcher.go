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

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/subjects"
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

// Services in start order. The gateway starts after all of them.
var Services = []string{"config", "session", "upload-staging", "plugin-sandbox", "durable-bridge"}

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
	// Scale maps a service to its replica count (plugin-sandbox only).
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
		if name != "plugin-sandbox" {
			return fmt.Errorf("--scale %s: only plugin-sandbox runs several replicas", name)
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
	natsURL := cfg.NATSURL
	if natsURL == "" {
		ns, err := natsutil.RunEmbedded(log)
		if err != nil {
			return err
		}
		stack = append(stack, ns.Shutdown)
		natsURL = ns.URL()
	}
	nc, err := natsutil.Connect(natsURL, "clawmesh-launcher", log)
	if err != nil {
		return err
	}
	stack = append(stack, nc.Close)

	sup := &supervisor{log: log, nc: nc, logDir: logDir, readyTimeout: cfg.ReadyTimeout}
	procs := plan(cfg, dbURL, natsURL)
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

// plan lists the processes with their arguments, gateway last.
func plan(cfg Config, dbURL, natsURL string) []*proc {
	common := []string{"--config-dir", cfg.DataDir, "--nats-url", natsURL}
	replicas := cfg.Scale["plugin-sandbox"]
	if replicas == 0 {
		replicas = 1
	}
	var plugins []string
	for i := range replicas {
		plugins = append(plugins, datadir.ServiceSocket(cfg.DataDir, "plugin-sandbox", i))
	}
	peers := []string{"--plugin-addr", strings.Join(plugins, ",")}
	var procs []*proc
	for _, svc := range Services {
		n := 1
		if svc == "plugin-sandbox" {
			n = replicas
		}
		for i := range n {
			name := svc
			if i > 0 {
				name += "." + strconv.Itoa(i)
			}
			sock := datadir.ServiceSocket(cfg.DataDir, svc, i)
			args := append(append([]string{}, common...), "--database-url", dbURL, "--listen", sock)
			args = append(args, peers...)
			if svc == "config" {
				for _, s := range cfg.Sets {
					args = append(args, "--set", s)
				}
			}
			procs = append(procs, &proc{name: name, bin: filepath.Join(cfg.BinDir, svc), args: args, health: sock})
		}
	}
	gw := append(append([]string{}, common...), peers...)
	if cfg.Ephemeral {
		gw = append(gw, "--ephemeral")
	}
	procs = append(procs, &proc{
		name: "gateway", bin: filepath.Join(cfg.BinDir, "gateway"), args: gw,
		health: datadir.ServiceSocket(cfg.DataDir, "gateway", 0), gateway: true, ephemeral: cfg.Ephemeral,
	})
	return procs
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
	raw, _ := json.Marshal(map[string]any{"service": name, "restart_count": count})
	_ = nc.Publish(subjects.SupervisorRestarts, raw)
}
