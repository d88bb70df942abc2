// Command config runs the config service.
package main

import (
	"context"
	"flag"
	"strings"

	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	"github.com/clawmesh/clawmesh/services/config"
	"github.com/clawmesh/clawmesh/services/config/migrations"
)

// setFlags collects the repeatable --set prop=value.
type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

func main() { service.Main(spec()) }

// spec is the config process: the launcher's --set overrides are
// committed before it serves, and a bad one stops it with an error that
// names the property.
func spec() service.Spec {
	var sets setFlags
	return service.Spec{
		Name:        "config",
		HealthNames: []string{configv1.ConfigService_ServiceDesc.ServiceName},
		Schema:      "config",
		Migrations:  migrations.FS,
		Flags: func(fs *flag.FlagSet) {
			fs.Var(&sets, "set", "commit prop=value at start (repeatable; the value is typed by the config schema)")
		},
		Register: func(ctx context.Context, env *service.Env) error {
			srv, err := config.New(ctx, config.Options{DB: env.DB, NATS: env.NATS, DataDir: env.DataDir, Log: env.Log})
			if err != nil {
				return err
			}
			if err := srv.ApplyStartup(ctx, sets); err != nil {
				return err
			}
			configv1.RegisterConfigServiceServer(env.Server.GRPC, srv)
			return nil
		},
	}
}
