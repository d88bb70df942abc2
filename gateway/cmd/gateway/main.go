// Command gateway runs the edge: the local NDJSON JSON-RPC socket.
package main

import (
	"context"
	"errors"
	"flag"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/gateway"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/service"
)

func main() { service.Main(spec()) }

func spec() service.Spec {
	var (
		socket    string
		dormant   string
		ephemeral bool
		drain     time.Duration
		g         *gateway.Gateway
	)
	return service.Spec{
		Name: "gateway",
		Role: bus.RoleGateway,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&socket, "socket", "", "client socket (env ZEROCLAW_SOCKET; default <data>/daemon.sock)")
			fs.BoolVar(&ephemeral, "ephemeral", false, "exit 1 s after the last client disconnects")
			fs.DurationVar(&drain, "client-drain", 10*time.Second, "longest drain of in-flight client requests at shutdown")
			fs.StringVar(&dormant, "dormant", "", "services the launcher may not have started yet (comma-separated): shown dormant while the launcher marks them so")
		},
		Register: func(ctx context.Context, env *service.Env) error {
			if socket == "" {
				socket = datadir.Socket(env.DataDir)
			}
			var plugins []string
			for _, a := range strings.Split(env.Peers.Plugin, ",") {
				if a = strings.TrimSpace(a); a != "" {
					plugins = append(plugins, a)
				}
			}
			// The launcher passes the client socket it keeps open, so
			// that clients wait in its backlog while this process
			// restarts; without one, listen on the path.
			ln, err := listenfd.Listener(listenfd.ClientSocket)
			if err != nil {
				return err
			}
			g, err = gateway.New(ctx, gateway.Config{
				DataDir: env.DataDir, Socket: socket, Listener: ln, NATS: env.NATS, Reason: env.Server.Reason,
				ConfigAddr: env.Peers.Config, SessionAddr: env.Peers.Session,
				UploadAddr: env.Peers.Upload, DurableAddr: env.Peers.Durable,
				PluginAddrs: plugins, Ephemeral: ephemeral, Drain: drain, Log: env.Log,
				Dormant: strings.FieldsFunc(dormant, func(r rune) bool { return r == ',' }),
			})
			if err != nil {
				return err
			}
			env.OnClose(g.Close)
			return nil
		},
		Run: func(ctx context.Context, env *service.Env) error {
			err := g.Run(ctx)
			if errors.Is(err, gateway.ErrEphemeralExit) {
				env.Log.Info("ephemeral gateway done")
				return nil
			}
			return err
		},
	}
}
