// Command durable-bridge runs the durable bridge: seed 004's durable
// agent, serving Collie on a private socket and, when configured, behind
// a token (see package durablebridge).
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	durablev1 "github.com/clawmesh/clawmesh/proto/clawmesh/durable/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/durablebridge"
	"github.com/clawmesh/clawmesh/services/durablebridge/migrations"
)

func main() {
	var bridge *durablebridge.Bridge
	var h handed
	service.Main(service.Spec{
		Name:        "durable-bridge",
		Role:        bus.RoleDurable,
		HealthNames: []string{durablev1.DurableService_ServiceDesc.ServiceName},
		Schema:      "durable",
		Migrations:  migrations.FS,
		Early:       h.answer,
		Register: func(ctx context.Context, env *service.Env) error {
			b, err := register(ctx, env, &h)
			bridge = b
			return err
		},
		Run: func(ctx context.Context, _ *service.Env) error { return bridge.Run(ctx) },
	})
}

// tokenProp is the bearer token's property; a secret, read with Reveal.
const tokenProp = "durable.token"

// handed is the durable socket the launcher handed over, if it did, and
// what answers on it until the bridge serves.
type handed struct {
	hostName string
	early    *durablebridge.Early // nil when no socket was handed
	passed   net.Listener
}

// answer takes the socket the launcher handed over (service.Spec.Early).
// The launcher holds it while the bridge is dormant and hands it over
// when a client's connection wakes the bridge. Until the bridge serves,
// the socket answers as an agent not ready yet does
// (durablebridge.AnswerEarly), naming what the start waits for: its
// database, the bus, config. A hello left in the backlog meanwhile was
// Collie's timeout (1000 ms), the agent shown unreachable with no
// reason, for as long as any of them was away.
func (h *handed) answer(env *service.Env) error {
	host, _ := os.Hostname()
	h.hostName = "clawmesh on " + host
	passed, err := listenfd.Listener(listenfd.DurableSocket)
	if err != nil {
		return fmt.Errorf("durable socket: %w", err)
	}
	if passed == nil {
		return nil
	}
	h.early, h.passed = durablebridge.AnswerEarly(passed, h.hostName, "", env.Log)
	// Closers run last first: the early answers stop before the socket
	// is closed.
	held := h.passed
	env.OnClose(func() { _ = held.Close() })
	env.OnClose(h.early.Stop)
	env.OnStarting(h.early.SetWaitingOn)
	return nil
}

func register(ctx context.Context, env *service.Env, h *handed) (*durablebridge.Bridge, error) {
	configConn, err := grpcclient.Dial(env.Peers.Config)
	if err != nil {
		return nil, fmt.Errorf("config service: %w", err)
	}
	env.OnClose(func() { _ = configConn.Close() })
	sessionConn, err := grpcclient.Dial(env.Peers.Session)
	if err != nil {
		return nil, fmt.Errorf("session service: %w", err)
	}
	env.OnClose(func() { _ = sessionConn.Close() })

	configRPC := configv1.NewConfigServiceClient(configConn)
	// The bridge waits for config however long it is away (AwaitConfig):
	// where it listens, its TLS, its token and whether it refuses
	// descendants are config's, never the defaults.
	live, err := env.AwaitConfig(ctx, configRPC)
	if err != nil {
		return nil, err
	}
	env.OnClose(live.Close)

	settings := live.Durable()
	socket := settings.SocketPath
	if socket == "" {
		socket = os.Getenv(durablesock.EnvSocket)
	}
	if socket == "" {
		socket = durablesock.DefaultSocket(env.DataDir)
	}
	early, passed, hostName := h.early, h.passed, h.hostName
	if passed != nil && passed.Addr().String() != socket {
		// durable.socket_path was set since the launcher took the
		// socket: the bridge listens where it now says.
		env.Log.Info("passed durable socket is not the configured one; listening there instead",
			zap.String("passed", passed.Addr().String()), zap.String("socket", socket))
		early.Stop()
		_ = passed.Close()
		passed = nil
	}
	// Read on every socket connection's requests: kept current from the
	// config's changes rather than rebuilt from the document each time.
	var refuse atomic.Bool
	refuse.Store(settings.RefuseDescendants)
	b, err := durablebridge.New(ctx, durablebridge.Config{
		DB: env.DB, NATS: env.NATS, Log: env.Log, Sessions: sessionv1.NewSessionServiceClient(sessionConn),
		SocketPath: socket, Socket: passed, ListenURL: settings.ListenURL, TLSCertFile: settings.TLSCertFile, TLSKeyFile: settings.TLSKeyFile,
		HostName:          hostName,
		RefuseDescendants: refuse.Load,
	})
	if err != nil {
		return nil, err
	}
	b.SetStarters(settings.Starters)

	// The token is a secret: the live document has it masked, Reveal
	// reads it, again whenever a change may have touched it, and again
	// after a read that failed until one succeeds.
	wake := make(chan struct{}, 1)
	tokens := durablebridge.TokenSource{
		Read: func(rctx context.Context) (string, error) {
			resp, err := configRPC.Reveal(rctx, &configv1.RevealRequest{Prop: tokenProp})
			return resp.GetValue().GetStringValue(), err
		},
		Set:   b.SetToken,
		Wake:  wake,
		Retry: time.Second,
		Log: func(err error) {
			env.Log.Warn("durable token not read; the token transport refuses every call until it is", zap.Error(err))
		},
	}
	loaded := tokens.Load(ctx)
	live.OnChange(func(s configclient.Snapshot, props []string) {
		d := s.Durable()
		refuse.Store(d.RefuseDescendants)
		b.SetStarters(d.Starters)
		if props == nil || slices.Contains(props, tokenProp) {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	})
	env.Go(func() { tokens.Follow(ctx, loaded) })
	durablev1.RegisterDurableServiceServer(env.Server.GRPC, durablebridge.NewGRPC(b))
	if early != nil {
		// The connections it has not taken wait for Run to serve them.
		early.Stop()
	}
	return b, nil
}
