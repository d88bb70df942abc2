// Package service is the process frame every Clawmesh service runs in:
// flags with environment fallbacks, logging, PostgreSQL with the service's
// migrations, NATS, a gRPC server with health and reflection, and a clean
// exit on SIGTERM.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/logging"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/pg"
)

// ErrShutdown is the cause of the base context's cancellation on SIGTERM.
var ErrShutdown = errors.New("service shutting down")

// Spec describes one service process.
type Spec struct {
	// Name is the process name and the default socket name: <data>/<Name>.sock.
	Name string
	// HealthNames are the gRPC service names reported SERVING once
	// Register has run.
	HealthNames []string
	// Schema is the service's PostgreSQL schema; Migrations its *.sql files.
	Schema     string
	Migrations fs.FS
	// Flags, when set, declares the service's own flags beside the common ones.
	Flags func(fs *flag.FlagSet)
	// Register builds the service and registers it on env.Server.GRPC. It
	// may start goroutines bound to ctx and add closers with env.OnClose.
	Register func(ctx context.Context, env *Env) error
}

// Peers are the gRPC addresses of the other services.
type Peers struct {
	Config, Session, Upload, Plugin, Durable string
}

// Env is what a service gets to build itself with.
type Env struct {
	Log     *zap.Logger
	Server  *grpcserver.Server
	DB      *pgxpool.Pool
	NATS    *nats.Conn
	DataDir string
	Listen  string
	Peers   Peers
	closers []func()
}

// OnClose registers f to run at shutdown, after the gRPC server stopped,
// in reverse order of registration.
func (e *Env) OnClose(f func()) { e.closers = append(e.closers, f) }

// Main runs the service and exits the process with its status.
func Main(spec Spec) {
	if err := Run(context.Background(), spec, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", spec.Name, err)
		os.Exit(1)
	}
}

type options struct {
	dataDir, listen, databaseURL, natsURL, logLevel string
	peers                                           Peers
	drain                                           time.Duration
}

func parseFlags(spec Spec, args []string) (options, error) {
	var o options
	name := spec.Name
	fsFlags := flag.NewFlagSet(name, flag.ContinueOnError)
	if spec.Flags != nil {
		spec.Flags(fsFlags)
	}
	fsFlags.StringVar(&o.dataDir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fsFlags.StringVar(&o.listen, "listen", os.Getenv("CLAWMESH_LISTEN"), "gRPC address: a socket path or host:port (env CLAWMESH_LISTEN; default <data>/"+name+".sock)")
	fsFlags.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (env DATABASE_URL)")
	fsFlags.StringVar(&o.natsURL, "nats-url", os.Getenv("NATS_URL"), "NATS URL (env NATS_URL)")
	fsFlags.StringVar(&o.logLevel, "log-level", "", "debug, info, warn or error (env CLAWMESH_LOG_LEVEL)")
	fsFlags.DurationVar(&o.drain, "drain", grpcserver.DefaultDrain, "longest graceful drain at shutdown")
	fsFlags.StringVar(&o.peers.Config, "config-addr", os.Getenv("CLAWMESH_CONFIG_ADDR"), "config service address (default <data>/config.sock)")
	fsFlags.StringVar(&o.peers.Session, "session-addr", os.Getenv("CLAWMESH_SESSION_ADDR"), "session service address (default <data>/session.sock)")
	fsFlags.StringVar(&o.peers.Upload, "upload-addr", os.Getenv("CLAWMESH_UPLOAD_ADDR"), "upload-staging service address (default <data>/upload-staging.sock)")
	fsFlags.StringVar(&o.peers.Plugin, "plugin-addr", os.Getenv("CLAWMESH_PLUGIN_ADDR"), "plugin-sandbox address(es), comma-separated (default <data>/plugin-sandbox.sock)")
	fsFlags.StringVar(&o.peers.Durable, "durable-addr", os.Getenv("CLAWMESH_DURABLE_ADDR"), "durable-bridge service address (default <data>/durable-bridge.sock)")
	if err := fsFlags.Parse(args); err != nil {
		return o, err
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
	if o.databaseURL == "" {
		return o, errors.New("no database: pass --database-url or set DATABASE_URL (clawmesh up does this for you)")
	}
	if o.natsURL == "" {
		return o, errors.New("no NATS: pass --nats-url or set NATS_URL (clawmesh up does this for you)")
	}
	return o, nil
}

// Run is Main without the exit: it returns when the service stopped.
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
	defer func() {
		for i := len(env.closers) - 1; i >= 0; i-- {
			env.closers[i]()
		}
	}()

	if spec.Schema != "" {
		dbCtx, dbCancel := context.WithTimeout(ctx, 60*time.Second)
		env.DB, err = pg.Open(dbCtx, o.databaseURL, spec.Schema, spec.Migrations, log)
		dbCancel()
		if err != nil {
			return err
		}
		env.OnClose(env.DB.Close)
	}
	env.NATS, err = natsutil.Connect(o.natsURL, "clawmesh-"+spec.Name, log)
	if err != nil {
		return err
	}
	env.OnClose(func() { _ = env.NATS.Drain() })

	env.Server = grpcserver.New(log, o.drain)
	if err := spec.Register(ctx, env); err != nil {
		return fmt.Errorf("register %s: %w", spec.Name, err)
	}
	lis, err := grpcserver.Listen(o.listen)
	if err != nil {
		return err
	}
	env.Server.SetServing(spec.HealthNames...)
	log.Info("serving", zap.String("listen", o.listen), zap.String("data_dir", o.dataDir))
	if err := env.Server.Serve(ctx, lis); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}
