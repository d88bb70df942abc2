// Command session runs the session service.
package main

import (
	"context"

	"github.com/clawmesh/clawmesh/internal/service"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/session"
	"github.com/clawmesh/clawmesh/services/session/migrations"
)

func main() {
	service.Main(service.Spec{
		Name:        "session",
		HealthNames: []string{sessionv1.SessionService_ServiceDesc.ServiceName},
		Schema:      "session",
		Migrations:  migrations.FS,
		Register: func(_ context.Context, env *service.Env) error {
			sessionv1.RegisterSessionServiceServer(env.Server.GRPC, session.New(env.DB, env.Log))
			return nil
		},
	})
}
