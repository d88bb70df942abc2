// Command durable-bridge runs the durable bridge. The durable wire comes
// with its own issue; until then its gRPC surface answers Unimplemented.
package main

import (
	"context"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/service"
	durablev1 "github.com/clawmesh/clawmesh/proto/clawmesh/durable/v1"
)

func main() {
	service.Main(service.Spec{
		Name:        "durable-bridge",
		Role:        bus.RoleDurable,
		HealthNames: []string{durablev1.DurableService_ServiceDesc.ServiceName},
		Register: func(_ context.Context, env *service.Env) error {
			durablev1.RegisterDurableServiceServer(env.Server.GRPC, durablev1.UnimplementedDurableServiceServer{})
			return nil
		},
	})
}
