package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/coalesce"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/unixsock"
	"github.com/clawmesh/clawmesh/internal/version"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// Causes of the gateway's base context cancellation.
var (
	// ErrEphemeralExit: in ephemeral mode, the last client left.
	ErrEphemeralExit = errors.New("gateway: last client disconnected (ephemeral)")
	// ErrShutdown: the process was asked to stop.
	ErrShutdown = errors.New("gateway: shutting down")
	// ErrConfigSettingsDiffer: the gateway started on the defaults of
	// rpc.* while config was away, and config, back, holds others. They
	// are read only at start: the gateway stops (not cleanly, so that
	// its supervisor starts it again, on them).
	ErrConfigSettingsDiffer = errors.New("gateway: started on the defaults of rpc.* while config was away, and config holds others: stopping to start again on them")
)

// configStartWait bounds New's wait for the config service's answer
// before the gateway listens on the defaults of rpc.*. The launcher
// starts the gateway once config serves, so config answers at once
// then; past this it is away or hung.
var configStartWait = 5 * time.Second

// Gateway is the edge process.
type Gateway struct {
	cfg     Config
	log     *zap.Logger
	limits  configclient.RPCLimits
	version string // server_version sent at initialize
	// statusFixed is the part of status's result fixed at start.
	statusFixed []byte
	started     time.Time

	// uid is this process's own (os.Getuid at New): a local peer with it
	// is bound as the operator when config cannot be asked
	// (operatorWithoutConfig).
	uid int64
	// configAway is set while the gateway listens on the defaults of
	// rpc.*, config having given no answer at its start (New), until
	// config answers with the same values (awaitConfig).
	configAway atomic.Bool

	config  configv1.ConfigServiceClient
	session sessionv1.SessionServiceClient
	upload  uploadv1.UploadServiceClient
	// plugins is the client of every sandbox replica at once, kept for
	// plugins/list so that what it learns of a replica (hung, gone)
	// holds for the calls after; nil without a sandbox. DialReplicas,
	// so that only a replica that serves is picked: one still starting
	// (compiling its plugins, --scale) answers Unavailable on its socket
	// already. Health asks each replica on its own connection.
	plugins pluginv1.PluginServiceClient
	// chunks is the upload-staging client's codec: a chunk's decoded
	// bytes are lent to it and sent from where they were decoded
	// (uploadChunk), not copied into a message first.
	chunks  *bulkcodec.Codec
	nats    *nats.Conn
	hub     *hub
	monitor *monitor
	conns   []*grpc.ClientConn
	ln      net.Listener
	// turnWait is turnCompleteWait unless a test shortens it.
	turnWait time.Duration
	// id names this gateway process to the upload-staging service, which
	// keeps its connections' uploads while it renews its lease.
	id string
	// scratchPath is upload-staging's scratch socket, "" when its
	// address is no Unix socket path (scratch.go).
	scratchPath string
	// uploadsUsed is closed at the first upload call (usingUploads).
	uploadsUsed chan struct{}
	uploadsOnce sync.Once
	// output is what the gateway holds for its clients and they have not
	// read: every connection's outbox (entryBytes) and output queue
	// together, bounded by rpc.max_buffered_output_bytes.
	output *jsonrpc.OutputBudget
	// largeReads holds a slot for each call of a large method running
	// (maxLargeReads). The output budget counts a reply once it is made;
	// the replies in the making (the service's message, the result, its
	// JSON: three forms of up to 4 MiB) were bounded only by the requests
	// in flight, 64 a connection: twelve connections that pipelined
	// transcript reads and read nothing took the gateway to 1.1 to 2.0
	// GiB with a 64 MiB budget on a loaded machine (0.23 GiB now).
	largeReads chan struct{}

	// wg counts every goroutine the gateway starts (spawn): outboxes,
	// elicitations, asks, the monitor. Run waits for them.
	wg sync.WaitGroup

	// statusReads and stateReads share concurrent identical reads of one
	// principal (see status, sessionState and sharedRead): one gRPC call
	// answers every caller that arrived while the previous one was in
	// flight, and those that arrived before the service read.
	statusReads coalesce.Group[string, sharedRead]
	stateReads  coalesce.Group[stateKey, sharedRead]
	// clockApart is set once a read_at proved the session service's clock
	// is not this process's (see readAt).
	clockApart atomic.Bool

	clients atomic.Int64
	mu      sync.Mutex
	graceT  *time.Timer
	states  map[*jsonrpc.Conn]*connState
}

// New dials the services (lazily: none needs to be up yet), reads the
// edge settings from the config service and listens on the client socket,
// so the process reports healthy only once clients can connect.
func New(ctx context.Context, cfg Config) (*Gateway, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg: cfg, log: cfg.Log, started: time.Now(), nats: cfg.NATS, id: ids.New("gw-"), uploadsUsed: make(chan struct{}), uid: int64(os.Getuid()),
		monitor: newMonitor(500*time.Millisecond, cfg.Log), states: map[*jsonrpc.Conn]*connState{},
	}
	if cfg.Reason != nil {
		g.monitor.addSelf(cfg.Reason)
	}
	g.chunks = bulkcodec.New(0, (&uploadv1.ChunkRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))
	g.scratchPath = filepass.ScratchSocketFor(cfg.UploadAddr)
	dial := func(name, addr string) (*grpc.ClientConn, error) {
		var opts []grpc.DialOption
		if name == "upload-staging" {
			opts = append(opts, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(g.chunks)))
		}
		cc, err := grpcclient.Dial(addr, opts...)
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
		var asleep func() bool
		if slices.Contains(cfg.Dormant, s.name) {
			mark := datadir.Dormant(cfg.DataDir, s.name)
			asleep = func() bool { _, err := os.Stat(mark); return err == nil }
		}
		g.monitor.add(s.name, cc, asleep)
		switch s.name {
		case "config":
			g.config = configv1.NewConfigServiceClient(cc)
		case "session":
			g.session = sessionv1.NewSessionServiceClient(cc)
		case "upload-staging":
			g.upload = uploadv1.NewUploadServiceClient(cc)
		}
	}
	if len(cfg.PluginAddrs) > 0 {
		// Lazy as the others: it connects at the first plugins/list.
		cc, err := grpcclient.DialReplicas(strings.Join(cfg.PluginAddrs, ","))
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("plugin-sandbox: %w", err)
		}
		g.conns = append(g.conns, cc)
		g.plugins = pluginv1.NewPluginServiceClient(cc)
	}
	// The edge's settings are read once, when the listener starts (they
	// need a restart to change). A config service that gives no answer
	// within configStartWait (down, or hung) does not keep the gateway
	// from listening: it listens on the schema's defaults, and Run reads
	// config's settings once it answers (awaitConfig). Waiting for config
	// failed the start after 60 s, in a loop, so that no client, the
	// operator asking health or status included, got any answer while
	// config was away. The defaults open no trust: who a caller is is
	// still config's to say at each initialize, and without it only the
	// operator is bound, by its uid (operatorWithoutConfig).
	liveCtx, cancel := context.WithTimeout(ctx, configStartWait)
	live, err := configclient.New(liveCtx, g.config, g.nats, g.log)
	away := err != nil && liveCtx.Err() != nil && ctx.Err() == nil
	cancel()
	switch {
	case err == nil:
		g.limits = live.RPCLimits()
		live.Close()
	case away:
		g.limits = configclient.Snapshot{}.RPCLimits()
		g.configAway.Store(true)
		g.log.Warn("config service unanswered: listening on the defaults of rpc.* until it answers",
			zap.Duration("waited", configStartWait), zap.Error(err))
	default:
		g.Close()
		return nil, fmt.Errorf("config service: %w", err)
	}
	g.output = jsonrpc.NewOutputBudget(g.limits.MaxBufferedOutputBytes)
	g.version = g.limits.AdvertisedServerVersion
	if g.version == "" {
		g.version = version.Version
	}
	g.statusFixed = encodeStatusFixed(g.version, cfg.DataDir, cfg.Socket)
	g.initSharedReads()
	var seqs updateSeqsFunc
	if g.session != nil {
		seqs = g.session.UpdateSeqs
	}
	g.hub = newHub(g.nats, g.log, seqs)
	if g.session != nil {
		g.hub.resend = g.session.Resend
	}
	if _, err := g.monitor.watchRestarts(g.nats); err != nil {
		g.Close()
		return nil, fmt.Errorf("subscribe restarts: %w", err)
	}
	g.ln = cfg.Listener
	if g.ln == nil {
		if g.ln, err = unixsock.Listen(cfg.Socket); err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// Close releases the service connections and the listener (Run closes
// the listener itself when it serves).
func (g *Gateway) Close() {
	if g.hub != nil {
		// Its reconnect checks call the session service.
		g.hub.close()
	}
	for _, cc := range g.conns {
		cc.Close()
	}
	// The shared reads' goroutines: with the connections to the services
	// closed, a read still in flight fails at once.
	g.statusReads.Wait()
	g.stateReads.Wait()
	if g.ln != nil {
		g.ln.Close()
	}
}

// spawn runs f on a goroutine Run waits for.
func (g *Gateway) spawn(f func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

// Run serves the socket until ctx is done or, in ephemeral mode, the last
// client has left; then it drains and removes the socket, and returns
// once every connection and every goroutine it started has ended. It
// returns the cause of the stop (ErrEphemeralExit, or nil for a
// requested stop).
func (g *Gateway) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(ErrShutdown)
	defer g.wg.Wait()
	g.monitor.first(ctx)
	g.spawn(func() { g.monitor.run(ctx) })
	g.spawn(func() { g.renewUploads(ctx) })
	g.spawn(func() { g.watchStanding(ctx) })
	if g.configAway.Load() {
		g.spawn(func() { g.awaitConfig(ctx, cancel) })
	}

	// Connections and their requests live on serveCtx, which the stop
	// signal does not cancel: the drain below lets in-flight requests
	// finish (and their updates flow) before anything is cut.
	serveCtx, serveCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer serveCancel()
	srv := &jsonrpc.Server{
		Options: jsonrpc.Options{
			MaxFrameBytes:     g.limits.MaxFrameBytes,
			InitializeTimeout: g.limits.InitializeTimeout,
			FrameTimeout:      g.limits.FrameTimeout,
			WriteStallTimeout: g.limits.WriteStallTimeout,
			// Bounds of docs/spec.md §3: requests in flight per
			// connection, unfinished frames and unread output across
			// all of them.
			MaxInflightRequests: g.limits.MaxInflightRequests,
			FrameBudget:         jsonrpc.NewFrameBudget(g.limits.MaxBufferedFrameBytes),
			OutputBudget:        g.output,
			Inline:              func(m string) bool { return methods[m].inline },
			Deferred:            func(m string) bool { return methods[m].later != nil },
			Urgent:              func(m string) bool { return methods[m].urgent },
			ParamsDone:          func(m string) bool { return methods[m].paramsDone },
			Logger:              g.log,
		},
		MaxConnections: g.limits.MaxConnections,
		NewHandler: func(c *jsonrpc.Conn, peer jsonrpc.Peer) jsonrpc.Handler {
			return g.accept(serveCtx, c, peer)
		},
		OnDisconnect: func(c *jsonrpc.Conn, peer jsonrpc.Peer, _ error) {
			g.disconnected(ctx, cancel, c)
		},
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(serveCtx, g.ln) }()
	g.log.Info("listening", zap.String("socket", g.cfg.Socket), zap.Int("max_connections", g.limits.MaxConnections),
		zap.Bool("ephemeral", g.cfg.Ephemeral), zap.String("server_version", g.version))

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("serve socket: %w", err)
		}
	}
	drainCtx, drainCancel := context.WithTimeout(context.Background(), g.cfg.Drain)
	defer drainCancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		g.log.Warn("drain cut short", zap.Error(err))
	}
	g.ln.Close()
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrEphemeralExit):
		return ErrEphemeralExit
	case errors.Is(cause, ErrConfigSettingsDiffer):
		return ErrConfigSettingsDiffer
	}
	return nil
}

// awaitConfig reads the live config once the config service answers,
// the gateway having started without it on the defaults of rpc.*
// (New): the same values, and nothing changes; others, and it stops the
// gateway with ErrConfigSettingsDiffer, to be started again on them, as
// a change of rpc.* always takes effect. The connections that stop then
// were made while config was away, when only the operator could bind.
func (g *Gateway) awaitConfig(ctx context.Context, stop context.CancelCauseFunc) {
	for {
		// No deadline: New waits for config's answer until ctx ends.
		live, err := configclient.New(ctx, g.config, g.nats, g.log)
		if err == nil {
			limits := live.RPCLimits()
			live.Close()
			if limits == g.limits {
				g.configAway.Store(false)
				g.log.Info("config service answered: its rpc.* are the defaults the gateway listens on")
				return
			}
			g.log.Warn("config service answered with rpc.* other than the defaults the gateway listens on: stopping to start again on them",
				zap.Any("config", limits), zap.Any("listening_on", g.limits))
			stop(ErrConfigSettingsDiffer)
			return
		}
		if ctx.Err() != nil {
			return
		}
		// The bus refused the subscription: try again shortly.
		g.log.Warn("config not followed yet", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// accept builds one client connection's state; disconnected tears it
// down once the connection closed and every handler of it returned, so
// no handler can attach anything to a connection already gone.
func (g *Gateway) accept(serveCtx context.Context, c *jsonrpc.Conn, peer jsonrpc.Peer) jsonrpc.Handler {
	cs := &connState{id: ids.New("conn-"), transport: transportLocal, conn: c, peer: peer, largeReads: make(chan struct{}, maxLargeReadsPerConn)}
	cs.outbox = newOutbox(serveCtx, g, cs)
	g.log.Info("connection accepted", zap.String("conn", cs.id), zap.Int32("peer_pid", peer.PID), zap.Int32("peer_uid", peer.UID))
	g.mu.Lock()
	g.states[c] = cs
	g.mu.Unlock()
	g.clientJoined()
	g.spawn(cs.outbox.run)
	return connHandler{g, cs}
}

// connHandler serves one connection's requests.
type connHandler struct {
	g  *Gateway
	cs *connState
}

func (h connHandler) Handle(ctx context.Context, _ *jsonrpc.Conn, req *jsonrpc.Request) (any, error) {
	return h.g.handle(ctx, h.cs, req)
}

func (h connHandler) HandleDeferred(ctx context.Context, _ *jsonrpc.Conn, req *jsonrpc.Request, reply jsonrpc.Reply) {
	h.g.handleLater(ctx, h.cs, req, reply)
}

func (g *Gateway) disconnected(runCtx context.Context, stop context.CancelCauseFunc, c *jsonrpc.Conn) {
	g.mu.Lock()
	cs := g.states[c]
	delete(g.states, c)
	g.mu.Unlock()
	if cs == nil {
		return
	}
	g.log.Info("connection closed", zap.String("conn", cs.id), zap.Int32("peer_pid", cs.peer.PID), zap.Int32("peer_uid", cs.peer.UID))
	g.connectionClosed(cs)
	g.clientLeft(runCtx, stop)
}

// handle routes one request through the method table.
func (g *Gateway) handle(ctx context.Context, cs *connState, req *jsonrpc.Request) (any, error) {
	m, ctx, cancel, err := g.route(ctx, cs, req)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if m.later != nil {
		// Served with a goroutine after all (the connection did not
		// defer it): wait for the reply here.
		type answer struct {
			result any
			err    error
		}
		ch := make(chan answer, 1)
		m.later(g, ctx, laterWait{deadline: g.laterDeadline(m)}, cs, req.Params, func(result any, err error) { ch <- answer{result, err} })
		a := <-ch
		return a.result, a.err
	}
	if m.large && g.largeReads != nil {
		// The connection's own slots first, then the gateway's: one
		// connection that pipelines large reads holds at most
		// maxLargeReadsPerConn of the gateway's, and the others' calls
		// still get theirs.
		for _, slots := range []chan struct{}{cs.largeReads, g.largeReads} {
			if slots == nil {
				continue
			}
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-ctx.Done():
				service, _, _ := strings.Cut(req.Method, "/")
				return nil, serviceError(service, context.Cause(ctx))
			}
		}
	}
	return m.call(g, ctx, cs, req.Params)
}

// maxLargeReads bounds the calls of large methods running at once: the
// replies they make hold at most three times 4 MiB each until queued.
// maxLargeReadsPerConn is what one connection may hold of them.
const (
	maxLargeReads        = 8
	maxLargeReadsPerConn = 2
)

// handleLater routes one request of a method served later (method.later)
// on the connection's read loop, as handle does, blocking on nothing.
func (g *Gateway) handleLater(ctx context.Context, cs *connState, req *jsonrpc.Request, reply jsonrpc.Reply) {
	m, ctx, cancel, err := g.route(ctx, cs, req)
	if err == nil && m.later == nil {
		// Options.Deferred names only methods with later set.
		err = fmt.Errorf("gateway: %q is not a deferred method", req.Method)
	}
	if err != nil {
		cancel()
		reply(nil, err)
		return
	}
	if !cs.waitsWatched.Load() && cs.waitsWatched.CompareAndSwap(false, true) {
		context.AfterFunc(ctx, func() { cs.waits.Leave(context.Cause(ctx)) })
	}
	// route gave a method served later no context of its own: nothing to
	// release once it replies. Its context's end is the connection's,
	// which cs.waits stands for.
	m.later(g, context.WithoutCancel(ctx), laterWait{g.laterDeadline(m), &cs.waits}, cs, req.Params, reply)
}

// laterWait is how long a request of a method served later waits for its
// answer: until deadline (zero: no deadline), and until owner leaves
// (nil: until the request's context ends).
type laterWait struct {
	deadline time.Time
	owner    *coalesce.Owner
}

// laterDeadline is the deadline of a request of m, a method served later,
// from now; zero when its kind has none.
func (g *Gateway) laterDeadline(m method) time.Time {
	if d := g.deadline(m.kind); d > 0 {
		return time.Now().Add(d)
	}
	return time.Time{}
}

// route finds req's method, checks that the connection may call it now,
// and gives ctx the method's deadline; cancel releases that deadline. A
// method served later gets its deadline from laterDeadline instead.
func (g *Gateway) route(ctx context.Context, cs *connState, req *jsonrpc.Request) (method, context.Context, context.CancelFunc, error) {
	m, known := methods[req.Method]
	if !(known && m.preInit) && !cs.initialized() {
		return m, ctx, func() {}, jsonrpc.NewError(jsonrpc.CodeAuthRequired, "First call must be 'initialize'", nil)
	}
	if !known {
		return m, ctx, func() {}, jsonrpc.MethodNotFound(req.Method)
	}
	if d := g.deadline(m.kind); d > 0 && m.later == nil {
		ctx, cancel := context.WithTimeout(ctx, d)
		return m, ctx, cancel, nil
	}
	return m, ctx, func() {}, nil
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
// session subscriptions, its asks, the turns it started and its staged
// uploads.
func (g *Gateway) connectionClosed(cs *connState) {
	cs.outbox.close()
	g.hub.detach(cs, "")
	cs.mu.Lock()
	sub := cs.askSub
	cs.askSub = nil
	cs.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	cs.scratch.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.discardUploads(ctx, cs)
	if _, err := g.session.ConnectionClosed(ctx, &sessionv1.ConnectionClosedRequest{ConnectionId: cs.id}); err != nil {
		g.log.Warn("turns of a closed connection not cancelled", zap.String("conn", cs.id), zap.Error(err))
	}
}

// wroteConfig records rev, the revision a config write of the
// connection's returned.
func (cs *connState) wroteConfig(rev int64) {
	for {
		old := cs.configRev.Load()
		if rev <= old || cs.configRev.CompareAndSwap(old, rev) {
			return
		}
	}
}

// connState is what the gateway knows of one client connection.
type connState struct {
	id     string
	conn   *jsonrpc.Conn
	peer   jsonrpc.Peer
	outbox *outbox

	// transport is transportLocal for the local socket (file_methods.go).
	transport string
	// uploads is set once the connection began an upload or attached a
	// file (usingUploads).
	uploads atomic.Bool
	// scratch is the memfd its upload chunks are decoded into (scratch.go).
	scratch connScratch

	// configRev is the highest config revision the connection's own
	// writes returned (wroteConfig), passed on with its session/new and
	// session/prompt so that the session service reads the write before
	// it refuses an agent the write made or runs a turn with the agent
	// as it was before the write.
	configRev atomic.Int64

	// waits stands for the connection's requests waiting for a shared
	// read (statusReads, stateReads): the connection's end answers them
	// all at once, watched once (waitsWatched) rather than once a request.
	// Atomic: a request held for room is dispatched by whichever
	// goroutine frees it, beside the read loop.
	waits        coalesce.Owner
	waitsWatched atomic.Bool

	// largeReads holds a slot for each of the connection's calls of a
	// large method running (maxLargeReadsPerConn).
	largeReads chan struct{}

	// following counts the sessions the connection follows, reserved the
	// follows session/new calls in progress hold for the sessions they
	// make (both hub.mu).
	following, reserved int
	// prompting counts the connection's prompts in progress by session;
	// leaving holds the sessions it closed or killed while one ran, left
	// once the last of them ends (both hub.mu; see hub.leave).
	prompting map[string]int
	leaving   map[string]bool

	mu        sync.Mutex
	principal *commonv1.Principal
	// readKey is the principal's encoding: reads are shared between
	// connections (Gateway.statusReads, stateReads) only under the same
	// one, which names the client process too (peer pid and uid).
	readKey     string
	elicitation bool
	tuiID       string
	askSub      *nats.Subscription
}

func (cs *connState) bind(p *commonv1.Principal, elicitation bool, tuiID string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.principal, cs.elicitation, cs.tuiID = p, elicitation, tuiID
	key, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		// A principal the service sent always encodes; should one not,
		// its reads are shared with nobody.
		key = []byte(cs.id)
	}
	cs.readKey = string(key)
}

// principalKey is the bound principal and its readKey.
func (cs *connState) principalKey() (*commonv1.Principal, string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.principal, cs.readKey
}

// principalOf is the bound principal (nil before initialize).
func (cs *connState) principalOf() *commonv1.Principal {
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
