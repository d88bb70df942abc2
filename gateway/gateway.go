package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/unixsock"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Causes of the gateway's base context cancellation.
var (
	// ErrEphemeralExit: in ephemeral mode, the last client left.
	ErrEphemeralExit = errors.New("gateway: last client disconnected (ephemeral)")
	// ErrShutdown: the process was asked to stop.
	ErrShutdown = errors.New("gateway: shutting down")
)

// Gateway is the edge process.
type Gateway struct {
	cfg     Config
	log     *zap.Logger
	limits  limits
	caps    []string
	started time.Time

	config  configv1.ConfigServiceClient
	session sessionv1.SessionServiceClient
	nats    *nats.Conn
	hub     *hub
	monitor *monitor
	conns   []*grpc.ClientConn

	clients atomic.Int64
	mu      sync.Mutex
	graceT  *time.Timer
}

// New dials the services (lazily: none needs to be up yet).
func New(cfg Config) (*Gateway, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: cfg.Log, started: time.Now(), monitor: newMonitor(500*time.Millisecond, cfg.Log), caps: methodNames()}
	dial := func(name, addr string) (*grpc.ClientConn, error) {
		cc, err := grpcclient.Dial(addr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		g.conns = append(g.conns, cc)
		return cc, nil
	}
	type svc struct{ name, addr string }
	list := []svc{{"config", cfg.ConfigAddr}, {"session", cfg.SessionAddr}, {"upload-staging", cfg.UploadAddr}, {"durable-bridge", cfg.DurableAddr}}
	for i, addr := range cfg.PluginAddrs {
		name := "plugin-sandbox"
		if i > 0 {
			name += "." + strconv.Itoa(i)
		}
		list = append(list, svc{name, addr})
	}
	for _, s := range list {
		if s.addr == "" {
			continue
		}
		cc, err := dial(s.name, s.addr)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.monitor.add(s.name, cc)
		switch s.name {
		case "config":
			g.config = configv1.NewConfigServiceClient(cc)
		case "session":
			g.session = sessionv1.NewSessionServiceClient(cc)
		}
	}
	return g, nil
}

// Close releases the service connections.
func (g *Gateway) Close() {
	for _, cc := range g.conns {
		cc.Close()
	}
	if g.nats != nil {
		g.nats.Close()
	}
}

// Run reads the edge settings from the config service, listens on the
// socket and serves until ctx is done or, in ephemeral mode, the last
// client has left; then it drains and removes the socket. It returns the
// cause of the stop (ErrEphemeralExit, or nil for a requested stop).
func (g *Gateway) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(ErrShutdown)

	live, err := g.fetchLive(ctx)
	if err != nil {
		return err
	}
	if g.limits, err = limitsFrom(live); err != nil {
		return fmt.Errorf("config revision %d: %w", live.GetRevision(), err)
	}
	g.nats, err = natsutil.Connect(g.cfg.NATSURL, "clawmesh-gateway", g.log)
	if err != nil {
		return err
	}
	g.hub = newHub(g.nats, g.log)
	if _, err := g.monitor.watchRestarts(g.nats); err != nil {
		return fmt.Errorf("subscribe restarts: %w", err)
	}
	go g.monitor.run(ctx)

	hs := grpcserver.New(g.log, g.cfg.Drain)
	if g.cfg.HealthListen != "" {
		hl, err := grpcserver.Listen(g.cfg.HealthListen)
		if err != nil {
			return err
		}
		go func() { _ = hs.Serve(ctx, hl) }()
		defer hs.Shutdown()
	}

	ln, err := unixsock.Listen(g.cfg.Socket)
	if err != nil {
		return err
	}
	// Connections and their requests live on serveCtx, which the stop
	// signal does not cancel: the drain below lets in-flight requests
	// finish (and their updates flow) before anything is cut.
	serveCtx, serveCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer serveCancel()
	srv := &jsonrpc.Server{
		Options: jsonrpc.Options{
			MaxFrameBytes:     g.limits.maxFrameBytes,
			InitializeTimeout: g.limits.initializeTimeout,
			FrameTimeout:      g.limits.frameTimeout,
			WriteStallTimeout: g.limits.writeStallTimeout,
			Inline:            func(m string) bool { return methods[m].inline },
			Logger:            g.log,
		},
		MaxConnections: g.limits.maxConnections,
		NewHandler: func(c *jsonrpc.Conn, peer jsonrpc.Peer) jsonrpc.Handler {
			return g.accept(ctx, serveCtx, cancel, c, peer)
		},
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(serveCtx, ln) }()
	hs.SetServing()
	g.log.Info("listening", zap.String("socket", g.cfg.Socket), zap.Int("max_connections", g.limits.maxConnections),
		zap.Bool("ephemeral", g.cfg.Ephemeral), zap.String("server_version", g.limits.serverVersion))

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("serve socket: %w", err)
		}
	}
	hs.Health.Shutdown()
	drainCtx, drainCancel := context.WithTimeout(context.Background(), g.cfg.Drain)
	defer drainCancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		g.log.Warn("drain cut short", zap.Error(err))
	}
	ln.Close()
	if cause := context.Cause(ctx); errors.Is(cause, ErrEphemeralExit) {
		return ErrEphemeralExit
	}
	return nil
}

// fetchLive waits for the config service and reads the live document.
func (g *Gateway) fetchLive(ctx context.Context) (*configv1.LiveResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		live, err := g.config.Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true))
		if err == nil {
			return live, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read config from the config service: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// accept sets up one client connection's state. runCtx ends when the
// gateway is asked to stop; serveCtx outlives it until the drain is over.
func (g *Gateway) accept(runCtx, serveCtx context.Context, stop context.CancelCauseFunc, c *jsonrpc.Conn, peer jsonrpc.Peer) jsonrpc.Handler {
	cs := &connState{id: newConnID(), conn: c, peer: peer}
	cs.outbox = newOutbox(g, cs)
	g.log.Info("connection accepted", zap.String("conn", cs.id), zap.Int32("peer_pid", peer.PID), zap.Int32("peer_uid", peer.UID))
	g.clientJoined()
	go cs.outbox.run(serveCtx)
	go func() {
		<-c.Done()
		g.log.Info("connection closed", zap.String("conn", cs.id), zap.Int32("peer_pid", peer.PID), zap.Int32("peer_uid", peer.UID))
		g.connectionClosed(cs)
		g.clientLeft(runCtx, stop)
	}()
	return jsonrpc.HandlerFunc(func(ctx context.Context, c *jsonrpc.Conn, req *jsonrpc.Request) (any, error) {
		return g.handle(ctx, cs, req)
	})
}

// handle routes one request through the method table.
func (g *Gateway) handle(ctx context.Context, cs *connState, req *jsonrpc.Request) (any, error) {
	m, known := methods[req.Method]
	if !(known && m.preInit) && !cs.initialized() {
		return nil, jsonrpc.NewError(rpcerr.CodeAuthRequired, "First call must be 'initialize'", nil)
	}
	if !known {
		return nil, jsonrpc.MethodNotFound(req.Method)
	}
	return m.call(g, ctx, cs, req.Params)
}

func (g *Gateway) clientJoined() {
	g.clients.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.graceT != nil {
		g.graceT.Stop()
		g.graceT = nil
	}
}

// clientLeft starts the ephemeral grace when the last client has gone.
func (g *Gateway) clientLeft(ctx context.Context, stop context.CancelCauseFunc) {
	if g.clients.Add(-1) != 0 || !g.cfg.Ephemeral || ctx.Err() != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.graceT != nil {
		g.graceT.Stop()
	}
	g.graceT = time.AfterFunc(g.cfg.EphemeralGrace, func() {
		if g.clients.Load() == 0 {
			g.log.Info("last client gone, ephemeral exit", zap.Duration("grace", g.cfg.EphemeralGrace))
			stop(ErrEphemeralExit)
		}
	})
}

// connectionClosed releases what the connection held: its outbox, its
// session subscriptions, its asks, and the turns it started.
func (g *Gateway) connectionClosed(cs *connState) {
	cs.outbox.close()
	g.hub.detach(cs, "")
	cs.mu.Lock()
	sub := cs.askSub
	cs.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := g.session.ConnectionClosed(ctx, &sessionv1.ConnectionClosedRequest{ConnectionId: cs.id}); err != nil {
		g.log.Warn("turns of a closed connection not cancelled", zap.String("conn", cs.id), zap.Error(err))
	}
}

// connState is what the gateway knows of one client connection.
type connState struct {
	id     string
	conn   *jsonrpc.Conn
	peer   jsonrpc.Peer
	outbox *outbox

	mu          sync.Mutex
	principal   *configv1.Principal
	elicitation bool
	tuiID       string
	askSub      *nats.Subscription
}

func (cs *connState) bind(p *configv1.Principal, elicitation bool, tuiID string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.principal, cs.elicitation, cs.tuiID = p, elicitation, tuiID
}

// principalOf is the bound principal (nil before initialize).
func (cs *connState) principalOf() *configv1.Principal {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.principal
}

// canElicit reports whether the client advertised elicitation.
func (cs *connState) canElicit() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.elicitation
}

func (cs *connState) initialized() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.principal != nil
}

func newConnID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "conn-" + hex.EncodeToString(b)
}
