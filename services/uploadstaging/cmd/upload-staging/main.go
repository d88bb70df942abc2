// Command upload-staging runs the upload-staging service: chunked uploads
// staged in memory until commit hands them to the session service.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/bulkcodec"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/filepass"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
	"github.com/clawmesh/clawmesh/services/uploadstaging"
)

// envLease names the environment fallback of --gateway-lease.
const envLease = "CLAWMESH_UPLOAD_GATEWAY_LEASE"

// bulk reads a chunk's bytes into buffers kept from one chunk to the
// next, and sends a committed file's bytes to StoreFile from where they
// are staged (internal/bulkcodec): the codec of the process's server and
// of its session service client.
var bulk = bulkcodec.New(0,
	(&uploadv1.ChunkRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"),
	(&sessionv1.StoreFileRequest{}).ProtoReflect().Descriptor().Fields().ByName("data"))

func main() { service.Main(spec()) }

// spec is the process, its flags read into register's lease.
func spec() service.Spec {
	var lease time.Duration
	transports := &uploadstaging.Transports{}
	return service.Spec{
		ServerOptions: []grpc.ServerOption{grpc.ForceServerCodecV2(bulk), grpc.StatsHandler(transports)},
		Name:          "upload-staging",
		Role:          bus.RoleUpload,
		HealthNames:   []string{uploadv1.UploadService_ServiceDesc.ServiceName},
		Flags: func(fs *flag.FlagSet) {
			def := uploadstaging.DefaultLease
			if v := os.Getenv(envLease); v != "" {
				if d, err := time.ParseDuration(v); err == nil && d > 0 {
					def = d
				}
			}
			fs.DurationVar(&lease, "gateway-lease", def, "how long a gateway's uploads outlive its last renewal (env "+envLease+")")
		},
		Register: func(ctx context.Context, env *service.Env) error { return register(ctx, env, lease, transports) },
	}
}

func register(ctx context.Context, env *service.Env, lease time.Duration, transports *uploadstaging.Transports) error {
	configConn, err := grpcclient.Dial(env.Peers.Config)
	if err != nil {
		return fmt.Errorf("config service: %w", err)
	}
	env.OnClose(func() { _ = configConn.Close() })
	sessionConn, err := grpcclient.Dial(env.Peers.Session, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(bulk)))
	if err != nil {
		return fmt.Errorf("session service: %w", err)
	}
	env.OnClose(func() { _ = sessionConn.Close() })

	// uploads.* follow the live config, read over gRPC on each announced
	// change. The service waits for config however long it is away
	// (AwaitConfig): every call needs config's authorization anyway.
	live, err := env.AwaitConfig(ctx, configv1.NewConfigServiceClient(configConn))
	if err != nil {
		return err
	}
	env.OnClose(live.Close)

	srv, err := uploadstaging.New(uploadstaging.Config{
		Sessions: sessionv1.NewSessionServiceClient(sessionConn), Authz: live, Settings: live.Uploads,
		Lease: lease, Log: env.Log, Chunks: bulk, Files: bulk, Transports: transports,
		FileSocket: filepass.SocketFor(env.Peers.Session),
		// Gateways on this host pass a scratch memfd a connection on a
		// socket beside the gRPC one (<name>.scratch.sock); a gRPC
		// address that is no Unix socket has none, and every chunk
		// comes in its message.
		ScratchSocket: filepass.ScratchSocketFor(env.Listen),
	})
	if err != nil {
		return err
	}
	env.OnClose(func() { _ = srv.Close() })
	env.Go(func() { srv.Run(ctx) })
	uploadv1.RegisterUploadServiceServer(env.Server.GRPC, srv)
	return nil
}
