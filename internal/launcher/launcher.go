// Package launcher is `clawmesh up`: it brings the whole suite up on one
// host (PostgreSQL, NATS, the services, then the gateway), supervises it,
// restarting a crashed process with backoff, and stops it in reverse order.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/natsembed"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/service"
	"github.com/clawmesh/clawmesh/internal/stack"
	"github.com/clawmesh/clawmesh/internal/startpages"
	"github.com/clawmesh/clawmesh/internal/subreaper"
	"github.com/clawmesh/clawmesh/internal/unixsock"
)

// Errors the launcher reports.
var (
	// ErrAlreadyRunning: another launcher holds the data directory's lock.
	ErrAlreadyRunning = errors.New("another clawmesh stack is already running on this data directory")
	// ErrEphemeralDone: ephemeral mode, the last client left.
	ErrEphemeralDone = errors.New("ephemeral stack: last client disconnected")
	// ErrNotReady: a process did not become healthy in time.
	ErrNotReady = errors.New("process did not become healthy")
	// ErrInterrupted: the start was interrupted (SIGINT, SIGTERM); what
	// had started was stopped.
	ErrInterrupted = errors.New("interrupted while starting")
	// ErrCannotRun: a process exited with service.ExitPermanent, a
	// failure no restart mends; the stack was stopped.
	ErrCannotRun = errors.New("process cannot run as configured")
	// ErrSocketInUse: the client socket's path is served by another
	// process (another stack's, through a shared ZEROCLAW_SOCKET).
	ErrSocketInUse = errors.New("another process serves this socket")
	// ErrDataDirRemoved: the data directory was removed (or replaced)
	// while the stack ran; the stack was stopped (datadirgone.go).
	ErrDataDirRemoved = errors.New("data directory removed while the stack ran")
)

// DefaultReadyTimeout is how long a start waits for a process that makes
// no progress (`clawmesh up --ready-timeout`).
const DefaultReadyTimeout = 60 * time.Second

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
	// ReadyTimeout bounds a wait for processes' health without progress
	// (supervisor.waitReadyTold); default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Liveness is how long a running process may leave its health check
	// unanswered before it is killed and restarted; default
	// DefaultLiveness, negative disables the probe.
	Liveness time.Duration
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
	if err := CheckScale(c.Scale); err != nil {
		return err
	}
	// Before anything starts: too large, they would fail the config
	// service's start.
	if _, err := service.StartupSetsEnv(c.Sets); err != nil {
		return err
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	switch {
	case c.Liveness == 0:
		c.Liveness = DefaultLiveness
	case c.Liveness < 0:
		c.Liveness = 0
	case c.Liveness < time.Second:
		return fmt.Errorf("--liveness-timeout %v: at least 1s (health is asked every second)", c.Liveness)
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
// (ErrEphemeralDone). When ctx ends before the stack is up it returns
// ErrInterrupted. Everything it started is stopped before it returns.
func Run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.withDefaults(); err != nil {
		return err
	}
	log := cfg.Log
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	// Before anything is written in it (private.go).
	if err := checkPrivate(cfg.DataDir); err != nil {
		return err
	}
	// The client socket lives here: the folder must be the owner's alone.
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	unlock, locked, err := lock(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	// What the start waits for, then what the launcher knows of each
	// process: one file (procstate.go), removed before the lock is
	// released. The start state of an older launcher, killed, is not
	// left to be read beside it.
	states := newProcStates(cfg.DataDir, log)
	defer states.remove()
	_ = os.Remove(datadir.Starting(cfg.DataDir))
	starting := newStartState(states)
	starting.set("checking the data directory and the binaries")
	// The folder the stack runs on, locked: watchDataDir compares with it.
	startedOn, err := os.Stat(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	// The lock covers the data directory, not a client socket moved out
	// of it (ZEROCLAW_SOCKET): one that answers is another stack's, which
	// listening would have taken over, leaving that stack unreachable.
	// Refused before anything starts.
	if socket := datadir.Socket(cfg.DataDir); unixsock.Serving(socket) {
		return fmt.Errorf("client socket %s: %w; stop that stack, or give this one another ZEROCLAW_SOCKET", socket, ErrSocketInUse)
	}
	// Before PostgreSQL is prepared and started: a clawmesh built alone
	// (no make build) learnt only then that the services were missing.
	if err := binariesPresent(cfg.BinDir); err != nil {
		return err
	}

	// Orphaned descendants stay in the launcher's tree (and are reaped
	// here): the durable bridge refuses the launcher's descendants by
	// walking parent pids, which a `setsid -f` or a double fork escaped.
	if stopReaping, err := subreaper.Start(); err != nil {
		log.Warn("orphaned descendants leave the launcher's tree; durable.refuse_descendants misses them", zap.Error(err))
	} else {
		defer stopReaping()
	}

	// Told once everything started has stopped (deferred before the
	// stoppers, so run after them, every run's output read by then): a
	// start that fails before "is up" upgraded the schemas all the same,
	// and an older clawmesh the operator goes back to refuses them.
	upgrades := newUpgradeNotices(cfg.Out)
	defer upgrades.stackUp()

	var stoppers []func() // run in reverse
	defer func() {
		for i := len(stoppers) - 1; i >= 0; i-- {
			stoppers[i]()
		}
	}()
	// An interrupt during the start is what the start failed of.
	defer func() {
		if err != nil && !errors.Is(err, ErrEphemeralDone) && ctx.Err() != nil {
			log.Info("start interrupted", zap.NamedError("cause", err))
			err = ErrInterrupted
		}
	}()

	logDir := filepath.Join(cfg.DataDir, "logs")
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return fmt.Errorf("log folder: %w", err)
	}
	sup := newSupervisor(log, logDir, cfg.Liveness)
	sup.onUpgrade = upgrades.seen
	// Removed (deferred above) after stopAll (deferred below, so run
	// before it): no run is started or noticed afterwards.
	sup.states = states
	states.probing(sup.probeEvery, cfg.Liveness)
	// Normally stopped before the bus (below); this is for an early return.
	defer sup.stopAll()
	stopCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchDataDir(stopCtx, cfg.DataDir, startedOn, locked, dataDirPoll, stop, log)
	}()
	defer func() { stop(nil); <-watched }()

	dbURL := cfg.DatabaseURL
	if dbURL == "" {
		if dbURL, err = startPostgres(ctx, cfg, sup, stop, starting); err != nil {
			return err
		}
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
	starting.set("connecting to the bus (NATS)")
	if natsURL == "" {
		ns, err := natsembed.Run(keys, log)
		if err != nil {
			return err
		}
		stoppers = append(stoppers, ns.Shutdown)
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
	stoppers = append(stoppers, nc.Close)
	notices := newRestartNotices(func(name string, n int) error { return bus.PublishRestart(nc, name, n) })
	sup.mu.Lock()
	sup.onRestart = notices.restarted
	sup.mu.Unlock()
	repeatCtx, stopRepeat := context.WithCancel(ctx)
	repeated := make(chan struct{})
	go func() {
		defer close(repeated)
		notices.repeat(repeatCtx, restartRepeat)
	}()
	// Before the bus connection closes (stoppers run in reverse).
	stoppers = append(stoppers, func() { stopRepeat(); <-repeated })

	// The client socket is the launcher's: the gateway gets a copy, and a
	// gateway that crashes or is replaced refuses no connection, which
	// waits in the backlog for the next one.
	socket := datadir.Socket(cfg.DataDir)
	client, err := unixsock.Listen(socket)
	if err != nil {
		return fmt.Errorf("client socket: %w", err)
	}
	stoppers = append(stoppers, func() { client.Close() })
	clientFile, err := client.File()
	if err != nil {
		return fmt.Errorf("client socket: %w", err)
	}
	stoppers = append(stoppers, func() { clientFile.Close() })
	// The durable bridge and upload-staging may sleep until a client
	// connects (dormant.go); their sockets are then the launcher's
	// meanwhile.
	durable, err := holdDurable(cfg.DataDir, log)
	if err != nil {
		return err
	}
	if durable != nil {
		stoppers = append(stoppers, durable.release)
	}
	staging, err := holdStaging(cfg.DataDir, log)
	if err != nil {
		return err
	}
	if staging != nil {
		stoppers = append(stoppers, staging.release)
	}
	var held []*dormant
	for _, d := range []*dormant{durable, staging} {
		if d != nil {
			held = append(held, d)
		}
	}
	procs, release, err := plan(cfg, dbURL, natsURL, clientFile, held)
	if err != nil {
		return err
	}
	stoppers = append(stoppers, release)
	// The processes stop before the bus and the sockets they use.
	stoppers = append(stoppers, sup.stopAll)
	// Services start together; the gateway only once they all serve.
	services, gateway := procs[:len(procs)-1], procs[len(procs)-1]
	sleeping := make([]*proc, len(held))
	for i, d := range held {
		for j, p := range services {
			if p.name == d.name {
				sleeping[i] = p
				services = append(services[:j:j], services[j+1:]...)
				break
			}
		}
	}
	for _, p := range services {
		if err := sup.start(p, stop); err != nil {
			return err
		}
	}
	names := make([]string, len(services))
	for i, p := range services {
		names[i] = p.name
	}
	starting.setf("waiting for %s to serve (schema migrations, the database, the bus; each one's log is in %s)",
		strings.Join(names, ", "), logDir)
	if err := sup.waitReady(ctx, cfg.ReadyTimeout, services); err != nil {
		return err
	}
	for _, p := range services {
		if p.served != nil {
			p.served()
		}
	}
	// The gateway starts before the dormant processes are settled: the
	// durable bridge's settings are a call to the config service (6 to
	// 10 ms), which the gateway's own start overlaps. It shows them
	// dormant from its first health poll either way (their markers are
	// in place since holdDurable and holdStaging).
	starting.set("waiting for the gateway to serve")
	if err := sup.start(gateway, stop); err != nil {
		return err
	}
	for i, d := range held {
		p := sleeping[i]
		// The gateway shows a woken process dormant (rather than
		// unreachable) until it answers its health check, then as it
		// answers: a start waiting for config said "dormant" for as long
		// as the wait for readiness lasted (ReadyTimeout), not why it
		// did not serve.
		start := func() error {
			if err := sup.start(p, stop); err != nil {
				return err
			}
			awake := func(*proc) {
				if err := clearDormant(cfg.DataDir, p.name); err != nil {
					log.Warn("dormant marker left", zap.Error(err))
				}
			}
			if err := sup.waitReadyTold(stopCtx, cfg.ReadyTimeout, []*proc{p}, awake); err != nil {
				log.Warn("a woken process is not ready", zap.String("process", p.name), zap.Error(err))
			}
			return nil
		}
		// Stopped before the processes (stoppers run in reverse), so no
		// wake starts one while they stop.
		stoppers = append(stoppers, d.close)
		if d == durable {
			switch yes, err := configured(ctx, datadir.ServiceSocket(cfg.DataDir, "config", 0)); {
			case err != nil:
				log.Warn("durable settings not read; the bridge starts now", zap.Error(err))
				d.wakeSoon(false, "its settings could not be read", start)
				continue
			case yes:
				d.wakeSoon(false, "durable.socket_path or durable.listen_url is set", start)
				continue
			}
		}
		log.Info("dormant until a client connects", zap.String("process", d.name), zap.String("socket", d.path))
		d.watch(start)
	}
	if err := sup.waitReady(ctx, cfg.ReadyTimeout, []*proc{gateway}); err != nil {
		return err
	}
	if cfg.DatabaseURL == "" {
		// Once, here: both files exist (the config service made the
		// secrets key at its first start), and "is up" means they are
		// kept (a data directory removed right after is recoverable).
		// It ran twice, after PostgreSQL was prepared and again after
		// the services served, each reading the id, both files and the
		// kept copies. A start that fails before this keeps nothing: its
		// cluster never served the stack, so holds nothing to get back.
		keepCredentials(cfg)
	}
	states.up()
	fmt.Fprintf(cfg.Out, "clawmesh %s is up\nsocket: %s\n", cfg.DataDir, socket)
	upgrades.stackUp()
	log.Info("stack up", zap.String("socket", socket), zap.String("data_dir", cfg.DataDir))
	startpages.Release()

	<-stopCtx.Done()
	cause := context.Cause(stopCtx)
	log.Info("stopping stack", zap.NamedError("cause", cause))
	if errors.Is(cause, ErrEphemeralDone) || errors.Is(cause, ErrCannotRun) || errors.Is(cause, ErrDataDirRemoved) {
		return cause
	}
	return nil
}

// startPostgres prepares the private cluster of the data directory and
// starts its server under supervision, like every other process; it
// returns the database URL once the server accepts connections.
func startPostgres(ctx context.Context, cfg Config, sup *supervisor, stop context.CancelCauseFunc, starting *startState) (string, error) {
	log := cfg.Log
	for _, dir := range pgcluster.Collect(cfg.DataDir, log) {
		log.Info("removed a postgres cluster no data directory owns", zap.String("dir", dir))
	}
	dir, err := pgcluster.Bind(cfg.DataDir)
	if err != nil {
		return "", err
	}
	if old := pgcluster.EarlierCluster(cfg.DataDir); old != "" {
		// Bind adopts it unless the data directory has a cluster already:
		// said, never removed, since it may hold what the user wants.
		log.Warn("an earlier version's postgres cluster of this data directory is left in place: the data directory uses another; remove it once nothing in it is needed",
			zap.String("earlier", old), zap.String("dir", dir))
	}
	log.Info("preparing private postgres", zap.String("dir", dir))
	starting.setf("preparing the postgres cluster %s (initdb, on a new one)", dir)
	prepCtx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	cl, err := pgcluster.Prepare(prepCtx, pgcluster.Options{Dir: dir, Log: log,
		PasswordFile: filepath.Join(cfg.DataDir, pgcluster.DataDirPasswordFile)})
	if err != nil {
		return "", fmt.Errorf("postgres: %w", err)
	}
	p := &proc{name: "postgres", command: cl.Command, stopSignal: pgcluster.ShutdownSignal, probe: postgresProbe{cl}}
	starting.setWritten(fmt.Sprintf("waiting for postgres to accept connections (cluster %s, log %s)", dir, filepath.Join(cfg.DataDir, "logs", "postgres.log")))
	if err := sup.start(p, stop); err != nil {
		return "", err
	}
	if err := sup.waitReady(ctx, cfg.ReadyTimeout, []*proc{p}); err != nil {
		return "", err
	}
	starting.set("creating the stack's database in postgres")
	readyCtx, cancel2 := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel2()
	if err := cl.EnsureDatabase(readyCtx); err != nil {
		return "", fmt.Errorf("postgres: %w", err)
	}
	return cl.URL(), nil
}

// keepCredentials keeps, for root, the data directory's password of its
// cluster and its secrets key beside the cluster, so that the directory
// removed and made again can get its database back by the command the
// start names (pgcluster.KeepCredentials).
// Not kept is said, not fatal: the stack runs as before.
func keepCredentials(cfg Config) {
	kept, err := pgcluster.KeepCredentials(cfg.DataDir)
	if err != nil {
		cfg.Log.Warn("the cluster's password and secrets key are not kept beside it: a data directory removed and made again cannot get its database back", zap.Error(err))
		return
	}
	if kept != "" {
		cfg.Log.Info("kept the cluster's password and secrets key beside it", zap.String("dir", kept))
	}
}

// plan lists the processes with their arguments and environment, in the
// stack table's order (gateway last). The gateway gets the client socket
// as a passed descriptor; every process not held dormant gets its gRPC
// socket bound by the launcher for its first run (firstSocket). release
// closes what was not handed over and removes those sockets; it runs
// once the processes have stopped.
func plan(cfg Config, dbURL, natsURL string, clientSocket *os.File, held []*dormant) (procs []*proc, release func(), err error) {
	common := []string{"--config-dir", cfg.DataDir}
	// The bus URL too: an operator's NATS_URL may carry a token or a user
	// and password (nats.go uses them), and on the command line every
	// local user read it in /proc/<pid>/cmdline.
	env := []string{service.EnvDatabaseURL + "=" + dbURL, service.EnvNATSURL + "=" + natsURL}
	var plugins []string
	for i := range max(cfg.Scale["plugin-sandbox"], 1) {
		plugins = append(plugins, datadir.ServiceSocket(cfg.DataDir, "plugin-sandbox", i))
	}
	// Every peer's address is given, so that a CLAWMESH_*_ADDR left in the
	// launcher's environment (a container's settings) cannot send a child
	// elsewhere than the sockets this stack listens on, and held: a
	// dormant process starts only when its own socket is dialled.
	addr := func(name string) string { return datadir.ServiceSocket(cfg.DataDir, name, 0) }
	peers := []string{
		"--config-addr", addr("config"), "--session-addr", addr("session"),
		"--upload-addr", addr(UploadStaging), "--durable-addr", addr(DurableBridge),
		"--plugin-addr", strings.Join(plugins, ","),
	}
	// The --set overrides travel in the config service's environment,
	// never on a command line another user can read in ps.
	sets, err := service.StartupSetsEnv(cfg.Sets)
	if err != nil {
		return nil, nil, err
	}
	if err := binariesPresent(cfg.BinDir); err != nil {
		return nil, nil, err
	}
	var bound []*firstSocket
	releaseBound := func() {
		for _, fs := range bound {
			fs.release()
		}
	}
	release = releaseBound
	defer func() {
		// Not release: an early return has set it to nil.
		if err != nil {
			releaseBound()
		}
	}()
	var asleep []string
	for _, d := range held {
		asleep = append(asleep, d.name)
	}
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
			penv := append(childEnv(os.Environ()), env...)
			// The --set overrides go to the config service's runs until
			// one has served (it commits them before it serves), not to
			// a run after a crash: committed again, they undid every
			// config/set made since the stack started.
			var overrides []string
			if sp.Role == bus.RoleConfig {
				overrides = sets
			}
			var served atomic.Bool
			if sp.Edge && cfg.Ephemeral {
				args = append(args, "--ephemeral")
			}
			if sp.Edge && len(asleep) > 0 {
				args = append(args, "--dormant", strings.Join(asleep, ","))
			}
			var mine *dormant // the socket this process is handed, if held
			for _, d := range held {
				if d.name == name {
					mine = d
				}
			}
			bin, edge := filepath.Join(cfg.BinDir, sp.Name), sp.Edge
			var first *firstSocket
			if mine == nil {
				if first, err = bindFirst(sock); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", name, err)
				}
				bound = append(bound, first)
			}
			probe, err := newHealthProbe(sock)
			if err != nil {
				return nil, nil, err
			}
			procs = append(procs, &proc{
				name: name, probe: probe, gateway: edge, ephemeral: edge && cfg.Ephemeral,
				command: func() *exec.Cmd {
					cmd := exec.Command(bin, args...)
					cmd.Env = slices.Clip(penv)
					if !served.Load() {
						cmd.Env = append(cmd.Env, overrides...)
					}
					var names []string
					var files []*os.File
					if edge {
						names, files = append(names, listenfd.ClientSocket), append(files, clientSocket)
					}
					if f := mine.passed(); f != nil {
						names, files = append(names, mine.fdName), append(files, f)
					}
					if f := first.handed(); f != nil {
						names, files = append(names, listenfd.GRPCSocket), append(files, f)
					}
					if len(files) > 0 {
						listenfd.Pass(cmd, names, files)
					}
					// Own process group: a terminal's Ctrl-C reaches only
					// the launcher, which stops everything in order.
					// Pdeathsig: a launcher killed outright takes its
					// children with it.
					cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
					return cmd
				},
				started: first.close,
				served:  func() { served.Store(true) },
			})
		}
	}
	return procs, release, nil
}

// firstSocket is a process's gRPC socket, bound by the launcher and
// handed to the process's first run. The launcher's readiness check
// then connects at once and waits in the socket's backlog until the
// process serves, where it otherwise retried the connection 5 to 20 ms
// apart until the socket appeared, as many milliseconds late on the
// start's critical path for every phase. The launcher keeps no copy
// once the run has started, so that the socket goes with the process
// and a peer's call to a process gone fails at once (a dormant process's
// socket is the one the launcher keeps, to wake it); later runs listen
// themselves.
type firstSocket struct {
	path string
	file *os.File // nil once closed
}

func bindFirst(path string) (*firstSocket, error) {
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	// The process serves the socket at path from now on: closing the
	// launcher's listener must not remove it.
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return &firstSocket{path: path, file: f}, nil
}

// handed returns the socket for a run to take, nil after the first.
func (s *firstSocket) handed() *os.File {
	if s == nil {
		return nil
	}
	return s.file
}

// close drops the launcher's copy: called once a run has started.
func (s *firstSocket) close() {
	if s != nil && s.file != nil {
		s.file.Close()
		s.file = nil
	}
}

// release closes the copy if no run took it and removes the socket,
// once every process has stopped: a process serving a passed socket
// does not remove it when it closes it, as one that listened does.
func (s *firstSocket) release() {
	s.close()
	_ = os.Remove(s.path)
}

// CheckScale refuses replica counts the launcher cannot run: a process
// that does not scale, or a count outside 1 to 64. The CLI calls it to
// refuse such a --scale as a command-line error before anything starts.
func CheckScale(scale map[string]int) error {
	for name, n := range scale {
		if p, ok := stack.Lookup(name); !ok || !p.Scalable {
			return fmt.Errorf("--scale %s: only %s runs several replicas", name, scalable())
		}
		if n < 1 || n > 64 {
			return fmt.Errorf("--scale %s=%d: replicas must be between 1 and 64", name, n)
		}
	}
	return nil
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

// binariesPresent checks that every process of the stack has its binary
// in binDir.
func binariesPresent(binDir string) error {
	for _, sp := range stack.Processes {
		if _, err := os.Stat(filepath.Join(binDir, sp.Name)); err != nil {
			return fmt.Errorf("%s binary: %w (run make build)", sp.Name, err)
		}
	}
	return nil
}

// lock takes the data directory's lock, so a second stack on the same
// directory refuses to start instead of fighting over its sockets. It
// returns the lock file's stat too: held open, its inode is never another
// file's while the stack runs (watchDataDir).
func lock(dir string) (func(), fs.FileInfo, error) {
	path := datadir.LockFile(dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("%w (%s, launcher pid %s); stop it first or use another --config-dir",
				ErrAlreadyRunning, dir, strings.TrimSpace(string(holder)))
		}
		return nil, nil, fmt.Errorf("lock %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("lock file: %w", err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		_ = f.Truncate(0)
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, fi, nil
}
