// Command plugin-sandbox runs one plugin-sandbox replica; the wiring is
// pluginsandbox.Register.
package main

import (
	"github.com/clawmesh/clawmesh/internal/service"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/migrations"
)

func main() {
	service.Main(service.Spec{
		Name:        "plugin-sandbox",
		HealthNames: []string{pluginv1.PluginService_ServiceDesc.ServiceName},
		Schema:      "plugin",
		Migrations:  migrations.FS,
		Register:    pluginsandbox.Register,
	})
}
