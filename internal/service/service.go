// Package service is the process frame every Clawmesh process runs in,
// the gateway included: flags with environment fallbacks, logging,
// signals, PostgreSQL with the process's migrations (only for a process
// that owns a schema), the bus under the process's own identity, a gRPC
// server with health and reflection, and a staged drain on SIGTERM.
//
// Health tells the truth: the process is NOT_SERVING while its database
// or the bus is unreachable (with the reason), and it exits when its bus
// connection is closed for good, so the launcher restarts it.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/logging"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/profiling"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/stack"
	"github.com/clawmesh/clawmesh/internal/startpages"
)

// Causes of the base context's cancellation.
var (
	// ErrShutdown: SIGTERM or SIGINT.
	ErrShutdown = errors.New("service shutting down")
	// ErrBusClosed: the bus connection was closed for good.
	ErrBusClosed = errors.New("bus connection closed")
	// ErrPermanent marks a failure no restart can mend (the data
	// directory does not fit the database, say): Main exits with
	// ExitPermanent, and the launcher stops the stack instead of
	// restarting the process in a loop.
	ErrPermanent = errors.New("cannot run as configured")
)

// ExitPermanent is the exit status of a process that failed with
// ErrPermanent (EX_CONFIG of sysexits.h).
const ExitPermanent = 78

// Dependency names in health reasons.
const (
	DepDatabase = "database"
	DepBus      = "bus"
)

// ErrDatabaseDiskFull is what a call answers whose write the database
// refused for want of disk space.
var ErrDatabaseDiskFull = errors.New("database: no space left on its disk")

// classifyDatabase names the database behind a failed call: unreachable
// (and health says so through setDependency), out of disk space, or busy
// (a statement it cancelled or rolled back), as an unavailable
// dependency; nil for any other error. A full disk was
// "internal error", "<service> failed" to the client, however long it
// lasted: nothing told a user that freeing space would mend it. Health
// stays as it is then: the database answers, and reads go on.
func classifyDatabase(err error, setDependency func(error)) error {
	switch {
	case pg.IsUnavailable(err):
		// Health says so at once, not at the next ping: a request
		// failing is the first sign of a database gone; the watch
		// clears it when the database answers again.
		setDependency(pg.ErrUnavailable)
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, pg.ErrUnavailable.Error())
	case pg.IsDiskFull(err):
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, ErrDatabaseDiskFull.Error())
	case pg.IsBusy(err):
		// Named, but health is left alone: the database answers.
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, pg.ErrBusy.Error())
	}
	return nil
}

// Spec describes one process.
type Spec struct {
	// Name is the process name and the default socket name: <data>/<Name>.sock.
	Name string
	// Role is the process's identity on the bus.
	Role bus.Role
	// HealthNames are the gRPC service names reported SERVING once
	// Register has run.
	HealthNames []string
	// Schema is the process's PostgreSQL schema and Migrations its *.sql
	// files; a process without a schema gets no database.
	Schema     string
	Migrations fs.FS
	// Flags, when set, declares the process's own flags beside the common
	// ones.
	Flags func(fs *flag.FlagSet)
	// Early, when set, runs before the start's first wait (the
	// database, the bus, then config): a process the launcher handed a
	// socket of its own besides the gRPC one (the durable bridge's,
	// which speaks HTTP to Collie) answers on it from there, saying
	// what the start waits for (Env.OnStarting). Begun in Register, it
	// left a client's connection in the socket's backlog for as long as
	// the database or the bus was away, a minute at most, then again
	// from the restart. Closers it adds run at shutdown as Register's.
	Early func(env *Env) error
	// Register builds the process's services and registers them on
	// env.Server.GRPC. It may start goroutines with env.Go and add closers
	// with env.OnClose.
	Register func(ctx context.Context, env *Env) error
	// Run, when set, is the process's own work beside the gRPC server (the
	// gateway serves its socket). It runs once the process serves; when it
	// returns the process stops with its result, and ctx's cancellation
	// (cause ErrShutdown or ErrBusClosed) asks it to return.
	Run func(ctx context.Context, env *Env) error
	// ServerOptions are the process's own options for its gRPC server
	// (a codec of its own, say).
	ServerOptions []grpc.ServerOption
}

// Peers are the gRPC addresses of the other processes.
type Peers struct {
	Config, Session, Upload, Plugin, Durable string
}

// Env is what a process gets to build itself with.
type Env struct {
	Log     *zap.Logger
	Server  *grpcserver.Server
	DB      *pgxpool.Pool
	NATS    *nats.Conn
	DataDir string
	Listen  string
	Peers   Peers

	closers []func()
	wg      sync.WaitGroup

	smu      sync.Mutex
	starting string         // what the start waits for now
	watchers []func(string) // OnStarting's
}

// OnStarting calls f with what the start waits for (health's reason:
// "waiting for the database", "connecting to the bus", StartingConfig,
// "setting up its services"), at once and at each change until the
// process serves.
func (e *Env) OnStarting(f func(what string)) {
	e.smu.Lock()
	defer e.smu.Unlock()
	e.watchers = append(e.watchers, f)
	f(e.starting)
}

// Starting says what Register does now, as health's reason until the
// process serves ("compiling plugin echo (tool world)"): a long start
// shows its steps, and the launcher takes a new step for progress rather
// than a stall. Call it from Register only. A socket the launcher handed
// over is answered from then on (AnswerEarly), as after a wait on
// config: held, its health said nothing for as long as the start took,
// and the launcher saw no step at all.
func (e *Env) Starting(what string) {
	e.setStarting(what, false)
	e.Server.AnswerEarly()
}

// setStarting says what the start waits for, to health (SetStarting, or
// SetWaitingOn when waitsOn: another process) and to OnStarting's.
func (e *Env) setStarting(what string, waitsOn bool) {
	e.smu.Lock()
	defer e.smu.Unlock()
	if waitsOn {
		e.Server.SetWaitingOn(what)
	} else {
		e.Server.SetStarting(what)
	}
	e.starting = what
	for _, f := range e.watchers {
		f(what)
	}
}

// OnClose registers f to run at shutdown, after the gRPC server stopped
// and every goroutine started with Go returned, in reverse order of
// registration.
func (e *Env) OnClose(f func()) { e.closers = append(e.closers, f) }

// Go runs f on a goroutine the process waits for before it closes
// anything: f must return when the process's context is done.
func (e *Env) Go(f func()) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
}

// releasePagesAfter is how long a process serves before it gives its
// start's pages of the executable back: past the launcher's readiness
// checks and a stack's first calls, well before the idle footprint is
// read (e2e's settle, 3 s after the first initialize).
const releasePagesAfter = time.Second

// databaseStartWait bounds the wait for the database at start (its first
// answer and the migrations): past it the process exits saying so, and
// the launcher (or Kubernetes) starts it again.
var databaseStartWait = 60 * time.Second

// databaseHost is where url points, without its user or password.
func databaseHost(url string) string {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil || cfg.ConnConfig.Host == "" {
		return "DATABASE_URL"
	}
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		return cfg.ConnConfig.Host
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

// Main runs the process and exits with its status.
func Main(spec Spec) {
	if err := Run(context.Background(), spec, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", spec.Name, err)
		if errors.Is(err, ErrPermanent) {
			os.Exit(ExitPermanent)
		}
		os.Exit(1)
	}
}

type options struct {
	dataDir, listen, databaseURL, natsURL, logLevel string
	peers                                           Peers
	drain                                           time.Duration
}

// EnvDatabaseURL names the database; it is read from the environment
// only, never from a flag, so a password in it never shows in ps.
const EnvDatabaseURL = "DATABASE_URL"

// EnvNATSURL names the bus. The launcher passes it here, not as
// --nats-url: the URL may carry a credential.
const EnvNATSURL = "NATS_URL"

// usageOutput is where -h and flag errors are printed (a test reads it).
var usageOutput io.Writer = os.Stderr

func parseFlags(spec Spec, args []string) (options, error) {
	var o options
	name := spec.Name
	fsFlags := flag.NewFlagSet(name, flag.ContinueOnError)
	fsFlags.SetOutput(usageOutput)
	if spec.Flags != nil {
		spec.Flags(fsFlags)
	}
	fsFlags.StringVar(&o.dataDir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fsFlags.StringVar(&o.listen, "listen", os.Getenv("CLAWMESH_LISTEN"), "gRPC address: a socket path or host:port (env CLAWMESH_LISTEN; default <data>/"+name+".sock)")
	// Not the flag's default: -h prints a default, and the URL may hold a
	// password (nats://user:password@host).
	fsFlags.StringVar(&o.natsURL, "nats-url", "", "NATS URL (env NATS_URL, where the launcher puts it); the credential comes from "+bus.EnvSeedFile+", "+bus.EnvSeed+" or <data>/bus/<role>.nk")
	fsFlags.StringVar(&o.logLevel, "log-level", "", "debug, info, warn or error (env CLAWMESH_LOG_LEVEL)")
	fsFlags.DurationVar(&o.drain, "drain", grpcserver.DefaultDrain, "longest graceful drain at shutdown")
	fsFlags.StringVar(&o.peers.Config, "config-addr", os.Getenv("CLAWMESH_CONFIG_ADDR"), "config service address (env CLAWMESH_CONFIG_ADDR; default <data>/config.sock)")
	fsFlags.StringVar(&o.peers.Session, "session-addr", os.Getenv("CLAWMESH_SESSION_ADDR"), "session service address (env CLAWMESH_SESSION_ADDR; default <data>/session.sock)")
	fsFlags.StringVar(&o.peers.Upload, "upload-addr", os.Getenv("CLAWMESH_UPLOAD_ADDR"), "upload-staging service address (env CLAWMESH_UPLOAD_ADDR; default <data>/upload-staging.sock)")
	fsFlags.StringVar(&o.peers.Plugin, "plugin-addr", os.Getenv("CLAWMESH_PLUGIN_ADDR"), "plugin-sandbox address(es), comma-separated (env CLAWMESH_PLUGIN_ADDR; default <data>/plugin-sandbox.sock)")
	fsFlags.StringVar(&o.peers.Durable, "durable-addr", os.Getenv("CLAWMESH_DURABLE_ADDR"), "durable-bridge service address (env CLAWMESH_DURABLE_ADDR; default <data>/durable-bridge.sock)")
	if err := fsFlags.Parse(args); err != nil {
		return o, err
	}
	if fsFlags.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fsFlags.Arg(0))
	}
	dir, err := datadir.Resolve(o.dataDir)
	if err != nil {
		return o, err
	}
	o.dataDir = dir
	if o.listen == "" {
		o.listen = datadir.ServiceSocket(dir, name, 0)
	}
	fill := func(p *string, svc string) {
		if *p == "" {
			*p = datadir.ServiceSocket(dir, svc, 0)
		}
	}
	fill(&o.peers.Config, "config")
	fill(&o.peers.Session, "session")
	fill(&o.peers.Upload, "upload-staging")
	fill(&o.peers.Plugin, "plugin-sandbox")
	fill(&o.peers.Durable, "durable-bridge")
	o.databaseURL = os.Getenv(EnvDatabaseURL)
	if spec.Schema != "" && o.databaseURL == "" {
		return o, errors.New("no database: set " + EnvDatabaseURL + " (clawmesh up does this for you)")
	}
	if o.natsURL == "" {
		o.natsURL = os.Getenv(EnvNATSURL)
	}
	if o.natsURL == "" {
		return o, errors.New("no NATS: pass --nats-url or set NATS_URL (clawmesh up does this for you)")
	}
	return o, nil
}

// ReplicaConnectionAge bounds the life of a client connection to a
// process that runs several replicas. The server then sends GOAWAY (calls
// in flight finish) and the client reconnects, which makes it resolve the
// name again: replicas added since (docker compose --scale, a
// HorizontalPodAutoscaler) get calls within this age plus the DNS
// resolver's 30 s floor, where a connection kept forever would never
// learn of them.
const ReplicaConnectionAge = 30 * time.Second

// serverOptions are the gRPC server options of the process named name.
func serverOptions(name string) []grpc.ServerOption {
	if p, ok := stack.Lookup(name); ok && p.Scalable {
		return []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: ReplicaConnectionAge})}
	}
	return nil
}

// Run is Main without the exit: it returns when the process stopped.
func Run(ctx context.Context, spec Spec, args []string) error {
	o, err := parseFlags(spec, args)
	if err != nil {
		return err
	}
	log, err := logging.New(spec.Name, o.logLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr sync errors are not actionable
	stopProfile, err := profiling.Start(spec.Name)
	if err != nil {
		return err
	}
	defer func() {
		if err := stopProfile(); err != nil {
			log.Warn("profiles not written", zap.Error(err))
		}
	}()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			log.Info("signal received, shutting down", zap.Stringer("signal", s))
			cancel(ErrShutdown)
		case <-ctx.Done():
		}
	}()

	env := &Env{Log: log, DataDir: o.dataDir, Listen: o.listen, Peers: o.peers}
	env.Server = grpcserver.New(log, o.drain, append(serverOptions(spec.Name), spec.ServerOptions...)...)
	defer func() {
		cancel(ErrShutdown)
		env.wg.Wait()
		for i := len(env.closers) - 1; i >= 0; i-- {
			env.closers[i]()
		}
	}()

	// A launcher that held this service's socket (its first run, or a
	// dormant service woken by a client) passes it: the connections made
	// meanwhile wait in its backlog until the process serves, and are
	// left there, a dormant service's first call among them (answered
	// now it would fail); the launcher says why it waits. Only a start
	// that waits on the config service past a moment answers them
	// (AwaitConfig). Otherwise the process listens on the address, and
	// health answers from here on, NOT_SERVING with what the start waits
	// for: a start that hung on its database answered no probe and no
	// status at all, only timeouts.
	lis, err := listenfd.Listener(listenfd.GRPCSocket)
	if err != nil {
		return err
	}
	if lis != nil {
		lis = env.Server.HoldEarly(lis)
	} else {
		if lis, err = grpcserver.Listen(o.listen); err != nil {
			return err
		}
		lis = env.Server.ServeEarly(lis)
	}
	// Serve closes lis once it served; a failed start closes it here.
	// Before the closers: the database is not closed under a call.
	defer env.Server.Shutdown()

	if spec.Schema != "" {
		env.setStarting("waiting for the database", false)
	} else {
		env.setStarting("connecting to the bus", false)
	}
	if spec.Early != nil {
		if err := spec.Early(env); err != nil {
			return fmt.Errorf("start %s: %w", spec.Name, err)
		}
	}
	if spec.Schema != "" {
		dbCtx, dbCancel := context.WithTimeout(ctx, databaseStartWait)
		env.DB, err = pg.Open(dbCtx, o.databaseURL, spec.Schema, spec.Migrations, log)
		dbCancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return fmt.Errorf("the database at %s did not answer within %v: %w", databaseHost(o.databaseURL), databaseStartWait, err)
			}
			if errors.Is(err, pg.ErrNewerSchema) {
				// Restarting would only find it again: the stack stops
				// and says why.
				return fmt.Errorf("%w: %w", ErrPermanent, err)
			}
			return err
		}
		env.OnClose(env.DB.Close)
		env.Server.SetDependency(DepDatabase, nil)
		env.Server.ClassifyError(func(err error) error {
			return classifyDatabase(err, func(err error) {
				// Calls fail at once from here on, until the watch's
				// ping (made now) is answered.
				pg.MarkUnavailable(env.DB)
				env.Server.SetDependency(DepDatabase, err)
			})
		})
		env.Go(func() { pg.Watch(ctx, env.DB, func(err error) { env.Server.SetDependency(DepDatabase, err) }) })
	}
	env.setStarting("connecting to the bus", false)
	seed, err := bus.LoadSeed(o.dataDir, spec.Role)
	if err != nil {
		return err
	}
	env.NATS, err = natsutil.Connect(natsutil.Options{
		URL: o.natsURL, Name: "clawmesh-" + spec.Name, Seed: seed, InboxPrefix: spec.Role.InboxPrefix(), Log: log,
		OnState: func(err error) { env.Server.SetDependency(DepBus, err) },
		OnClosed: func(err error) {
			log.Error("bus connection closed for good, stopping", zap.Error(err))
			cancel(fmt.Errorf("%w: %w", ErrBusClosed, err))
		},
	})
	if err != nil {
		return err
	}
	env.OnClose(func() { _ = env.NATS.Drain() })

	env.setStarting("setting up its services", false)
	if err := spec.Register(ctx, env); err != nil {
		return fmt.Errorf("register %s: %w", spec.Name, err)
	}
	env.Server.SetServing(spec.HealthNames...)
	log.Info("serving", zap.String("listen", o.listen), zap.String("data_dir", o.dataDir))
	// Start-up is over: its pages of the binary go back (see startpages),
	// once the stack's start has been served with them. Given back here,
	// before the first health check and the first calls, they were
	// faulted back in on the start's critical path.
	env.Go(func() {
		t := time.NewTimer(releasePagesAfter)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
			startpages.Release()
		}
	})

	serveErr := make(chan error, 1)
	go func() {
		err := env.Server.Serve(ctx, lis)
		if err != nil {
			cancel(fmt.Errorf("serve: %w", err))
		}
		serveErr <- err
	}()
	var runErr error
	if spec.Run != nil {
		runErr = spec.Run(ctx, env)
		cancel(ErrShutdown)
	}
	if err := <-serveErr; err != nil && runErr == nil {
		runErr = fmt.Errorf("serve: %w", err)
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrBusClosed) && runErr == nil {
		runErr = cause
	}
	if runErr != nil {
		return runErr
	}
	log.Info("stopped")
	return nil
}
