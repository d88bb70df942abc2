// Package durablebridge is the durable bridge: the durable agent of seed
// 004, through which Collie (the phone bridge) watches every Clawmesh
// session, answers its approval requests, steers and stops turns, opens
// sessions from starters and browses history.
//
// It speaks the durable wire (../shared/WIRE.md) over HTTP on a private
// Unix socket and, when configured, behind a bearer token on a TLS (or
// loopback) address; the same handler serves both. A pane is a session, a
// tab the sessions of one agent alias, the workspace the data directory
// (SPEC §9).
//
// The bridge acts for the machine's owner: every call it makes to the
// session service carries the operator principal
// (configschema.OperatorPrincipal), as a local client of the owner's own
// uid would. Whoever can reach the private socket (the owner's processes)
// or holds the token can therefore do what the operator can to sessions.
//
// It reads sessions over the session service's gRPC API and follows every
// session's updates on the bus under its own role (internal/bus), never
// the session service's tables. Its own state (epochs, request ids,
// decided asks, titles, queued texts) lives in its PostgreSQL schema.
package durablebridge

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Config is what the bridge is built from.
type Config struct {
	DB       *pgxpool.Pool
	NATS     *nats.Conn
	Log      *zap.Logger
	Sessions sessionv1.SessionServiceClient

	// SocketPath is the private socket (COLLIE_DURABLE_SOCKET or
	// <data_dir>/durable.sock); it must pass durablesock.CheckSocketPath.
	SocketPath string
	// Socket, when set, is the private socket already listening at
	// SocketPath, handed over by the launcher that held it while the
	// bridge was dormant; the bridge closes it when it stops.
	Socket net.Listener
	// ListenURL, when set, is the token transport's address: https://
	// with TLSCertFile and TLSKeyFile, or http://127.0.0.1:<port> or
	// http://localhost:<port> for a local test.
	ListenURL, TLSCertFile, TLSKeyFile string
	// HostName is hello's host.name (cut to 64 bytes).
	HostName string
	// RefuseDescendants, when it returns true, refuses socket callers
	// that descend from the stack's launcher (403 caller-refused).
	RefuseDescendants func() bool

	// ReconcileEvery is how often the layout is compared with the session
	// service's list (default 2 s): sessions opened or closed without a
	// turn publish nothing on the bus.
	ReconcileEvery time.Duration
	// CallTimeout bounds each call to the session service (default 10 s).
	CallTimeout time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.DB == nil || c.NATS == nil || c.Sessions == nil {
		return c, errors.New("durable bridge: a database, a NATS connection and the session service are required")
	}
	if c.SocketPath == "" {
		return c, errors.New("durable bridge: a socket path is required")
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.HostName == "" {
		c.HostName = "clawmesh"
	}
	if c.RefuseDescendants == nil {
		c.RefuseDescendants = func() bool { return false }
	}
	if c.ReconcileEvery <= 0 {
		c.ReconcileEvery = 2 * time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 10 * time.Second
	}
	return c, nil
}

// Bridge is one start of the durable bridge: one epoch.
type Bridge struct {
	cfg      Config
	log      *zap.Logger
	layout   *Layout
	store    *store
	memory   *requestMemory
	sessions sessionv1.SessionServiceClient
	follower *follower

	// token is the SHA-256 of the bearer token; nil refuses every call
	// of the token transport.
	token atomic.Pointer[[32]byte]
	// incompatibleLogged: a version mismatch is logged once per epoch.
	incompatibleLogged atomic.Bool
	// launcher is the pid whose descendants may be refused.
	launcher int
	// startingMsg, when set, is what 503 starting says (Early's, naming
	// what the start waits for).
	startingMsg atomic.Pointer[string]

	socket   net.Listener
	tokenLn  net.Listener
	prefix   string
	listenAt string

	// base is the parent of the work a POST starts (it outlives the
	// phone's connection, not the bridge); handlers counts the requests
	// being served, so Run returns after the last.
	base     context.Context
	handlers sync.WaitGroup

	// closed remembers when the phone closed a session, so a list read
	// before the close does not show it again.
	closedMu sync.Mutex
	closed   map[string]time.Time
}

// New starts an epoch: it draws a new epoch, reads the stored titles and
// opens the listeners (refusing a socket path that is not private).
// Nothing is served until Run.
func New(ctx context.Context, cfg Config) (*Bridge, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Bridge{cfg: cfg, log: cfg.Log, store: &store{db: cfg.DB}, sessions: cfg.Sessions, launcher: launcherPID(), base: context.Background()}
	epoch, err := b.store.newEpoch(ctx)
	if err != nil {
		return nil, err
	}
	b.layout = NewLayout(epoch)
	b.memory = newRequestMemory(b.store, epoch, b.log)
	b.follower = newFollower(b)
	titles, err := b.store.titles(ctx)
	if err != nil {
		return nil, err
	}
	b.layout.setTitles(titles)

	b.socket = cfg.Socket
	if b.socket == nil {
		if b.socket, err = durablesock.ListenSocket(cfg.SocketPath); err != nil {
			return nil, err
		}
	}
	if cfg.ListenURL != "" {
		if b.tokenLn, b.prefix, err = listenToken(cfg.ListenURL, cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			b.socket.Close()
			return nil, err
		}
		b.listenAt = b.tokenLn.Addr().String()
	}
	return b, nil
}

// Layout is what the bridge shows.
func (b *Bridge) Layout() *Layout { return b.layout }

// SocketPath is the private socket's path.
func (b *Bridge) SocketPath() string { return b.cfg.SocketPath }

// ListenAddr is the token transport's bound address ("" when off).
func (b *Bridge) ListenAddr() string { return b.listenAt }

// SetToken installs the token transport's bearer token; an empty one
// refuses every call there.
func (b *Bridge) SetToken(token string) {
	if token == "" {
		b.token.Store(nil)
		return
	}
	h := sha256.Sum256([]byte(token))
	b.token.Store(&h)
}

// SetStarters installs the configured starters.
func (b *Bridge) SetStarters(s []configclient.DurableStarter) { b.layout.setStarters(s) }

// tokenOK compares a presented token with the configured one in
// constant time (hashes, so the length does not show either).
func (b *Bridge) tokenOK(presented string) bool {
	want := b.token.Load()
	got := sha256.Sum256([]byte(presented))
	if want == nil {
		// Compare anyway, so a missing token takes as long as a wrong one.
		subtle.ConstantTimeCompare(got[:], got[:])
		return false
	}
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// Run serves both transports and follows the sessions until ctx is done,
// then stops serving (bounded), cancels the work of POSTs still running,
// and returns once every request ended. Run is called once.
func (b *Bridge) Run(ctx context.Context) error {
	b.base = ctx
	unsubscribe, err := b.follower.subscribe()
	if err != nil {
		return err
	}
	defer unsubscribe()

	var wg sync.WaitGroup
	var servers []*http.Server
	errc := make(chan error, 2)
	serve := func(ln net.Listener, tr transport, prefix string) {
		srv := b.httpServer(tr, prefix)
		servers = append(servers, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serveWire(srv, ln, tr); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("durable %s transport: %w", tr, err)
			}
		}()
	}
	serve(boundConns(b.socket, socketConns), overSocket, "")
	if b.tokenLn != nil {
		serve(b.tokenLn, overToken, b.prefix)
	}
	b.log.Info("durable bridge serving", zap.String("socket", b.cfg.SocketPath), zap.String("listen", b.listenAt),
		zap.String("epoch", b.layout.Epoch()))

	followCtx, stopFollow := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.follower.run(followCtx)
	}()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	stopFollow()
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shut); err != nil {
			srv.Close()
		}
	}
	wg.Wait()
	// Close does not wait for handlers; their work derives from ctx, which
	// is done, so they end promptly.
	b.handlers.Wait()
	return runErr
}

// noteClosed records that the phone closed a session now.
func (b *Bridge) noteClosed(id string) {
	b.closedMu.Lock()
	defer b.closedMu.Unlock()
	if b.closed == nil {
		b.closed = map[string]time.Time{}
	}
	now := time.Now()
	for k, at := range b.closed {
		if now.Sub(at) > time.Minute {
			delete(b.closed, k)
		}
	}
	b.closed[id] = now
}

// closedSince reports whether the phone closed a session after t.
func (b *Bridge) closedSince(id string, t time.Time) bool {
	b.closedMu.Lock()
	defer b.closedMu.Unlock()
	at, ok := b.closed[id]
	return ok && !at.Before(t)
}

// operator is the principal the bridge acts as: the machine's owner.
func operator() *commonv1.Principal {
	return &commonv1.Principal{PrincipalId: configschema.OperatorPrincipal, Operator: true}
}

func (t transport) String() string {
	if t == overToken {
		return "token"
	}
	return "socket"
}
