// Command session runs the session service.
package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/session"
	"github.com/clawmesh/clawmesh/services/session/migrations"
)

// files reads StoreFile's bytes into buffers kept from one store to the
// next (internal/bulkcodec).
var files = bulkcodec.New(0, (&sessionv1.StoreFileRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))

// standing refuses a user principal whose binding was revoked, at every
// method; register gives it the live config. A StoreFile it refuses never
// reaches the handler that gives the file's bytes back to files.
var standing = session.Standing{Refused: func(req any) {
	if r, ok := req.(*sessionv1.StoreFileRequest); ok {
		files.Release(r.GetData())
	}
}}

func main() {
	service.Main(service.Spec{
		Name:          "session",
		Role:          bus.RoleSession,
		HealthNames:   []string{sessionv1.SessionService_ServiceDesc.ServiceName},
		Schema:        "session",
		Migrations:    migrations.FS,
		Register:      register,
		ServerOptions: []grpc.ServerOption{grpc.ForceServerCodecV2(files), grpc.ChainUnaryInterceptor(standing.Unary)},
	})
}

func register(ctx context.Context, env *service.Env) error {
	configConn, err := grpcclient.Dial(env.Peers.Config)
	if err != nil {
		return fmt.Errorf("config service: %w", err)
	}
	env.OnClose(func() { _ = configConn.Close() })
	// Tool and memory calls go only to a replica that serves: one still
	// starting (compiling its plugins) answers Unavailable on its socket
	// already. Memory calls are spread too: the replicas share the
	// memory journals, and a replica gives its instance what another
	// stored before it answers.
	pluginConn, err := grpcclient.DialReplicas(env.Peers.Plugin)
	if err != nil {
		return fmt.Errorf("plugin sandbox: %w", err)
	}
	env.OnClose(func() { _ = pluginConn.Close() })

	configRPC := configv1.NewConfigServiceClient(configConn)
	// The agents come from the live config, followed over NATS. The
	// service waits for config however long it is away (AwaitConfig):
	// its agents and the bounds of stored files are config's, never the
	// defaults, and each user's call needs config's authorization.
	live, err := env.AwaitConfig(ctx, configRPC)
	if err != nil {
		return err
	}
	env.OnClose(live.Close)
	standing.Set(live)

	// Files upload-staging hands over in memfds come on a socket beside
	// the gRPC one; a socket that cannot be made leaves every file to
	// come in StoreFile's message, as upload-staging falls back to.
	var receiver *filepass.Receiver
	if path := filepass.SocketFor(env.Listen); path != "" {
		r, err := filepass.Listen(path, filepass.Options{TTL: session.FileHandOverTTL})
		if err != nil {
			env.Log.Warn("file socket not made, files come in messages", zap.String("path", path), zap.Error(err))
		} else {
			receiver = r
			env.OnClose(func() { _ = r.Close() })
		}
	}

	srv, err := session.New(ctx, session.Config{
		DB: env.DB, NATS: env.NATS, Log: env.Log, DataDir: env.DataDir,
		Agents:  &session.ConfigAgents{Live: live, Client: configRPC, Log: env.Log},
		Authz:   live,
		Plugins: pluginv1.NewPluginServiceClient(pluginConn),
		// Bounds how often a tool listing is made again.
		PluginReplicas: grpcclient.Addrs(env.Peers.Plugin),
		Files:          files,
		Uploads:        live.Uploads,

		FileReceiver: receiver,
	})
	if err != nil {
		return err
	}
	// On SIGTERM running turns are cancelled at once (each publishes its
	// turn_complete), so the gRPC drain does not wait for long turns; the
	// closer waits for them before NATS and the database close.
	context.AfterFunc(ctx, srv.Shutdown)
	env.OnClose(srv.Shutdown)
	sessionv1.RegisterSessionServiceServer(env.Server.GRPC, srv)
	return nil
}
