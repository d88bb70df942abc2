// Command plugin-sandbox runs one plugin-sandbox replica.
package main

import (
	"context"

	"github.com/clawmesh/clawmesh/internal/service"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/migrations"
)

func main() {
	service.Main(service.Spec{
		Name:        "plugin-sandbox",
		HealthNames: []string{pluginv1.PluginService_ServiceDesc.ServiceName},
		Schema:      "plugin",
		Migrations:  migrations.FS,
		Register: func(_ context.Context, env *service.Env) error {
			pluginv1.RegisterPluginServiceServer(env.Server.GRPC, pluginv1.UnimplementedPluginServiceServer{})
			return nil
		},
	})
}
