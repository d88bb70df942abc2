// Command upload-staging runs the upload-staging service. Its methods come
// with the uploads issue; until then it answers Unimplemented.
package main

import (
	"context"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/service"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

func main() {
	service.Main(service.Spec{
		Name:        "upload-staging",
		Role:        bus.RoleUpload,
		HealthNames: []string{uploadv1.UploadService_ServiceDesc.ServiceName},
		Register: func(_ context.Context, env *service.Env) error {
			uploadv1.RegisterUploadServiceServer(env.Server.GRPC, uploadv1.UnimplementedUploadServiceServer{})
			return nil
		},
	})
}
