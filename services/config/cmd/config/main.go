// Command config runs the config service.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	"github.com/clawmesh/clawmesh/services/config"
	"github.com/clawmesh/clawmesh/services/config/migrations"
)

// EnvStartupSets holds the launcher's --set overrides (see
// service.EnvStartupSets).
const EnvStartupSets = service.EnvStartupSets

func main() { service.Main(spec()) }

// spec is the config process: the launcher's --set overrides are
// committed before it serves, and a bad one stops it with an error that
// names the property.
func spec() service.Spec {
	return service.Spec{
		Name:        "config",
		Role:        bus.RoleConfig,
		HealthNames: []string{configv1.ConfigService_ServiceDesc.ServiceName},
		Schema:      "config",
		Migrations:  migrations.FS,
		Register: func(ctx context.Context, env *service.Env) error {
			sets, err := service.StartupSets(os.Getenv)
			if err != nil {
				return err
			}
			srv, err := config.New(ctx, config.Options{DB: env.DB, NATS: env.NATS, DataDir: env.DataDir, Log: env.Log})
			if errors.Is(err, config.ErrKeyMismatch) {
				return fmt.Errorf("%w: %w", service.ErrPermanent, err)
			}
			if err != nil {
				return err
			}
			if err := srv.ApplyStartup(ctx, sets); err != nil {
				return err
			}
			configv1.RegisterConfigServiceServer(env.Server.GRPC, srv)
			env.Go(func() { srv.Run(ctx) })
			return nil
		},
	}
}
