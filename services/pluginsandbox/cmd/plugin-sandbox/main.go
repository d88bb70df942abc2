// Command plugin-sandbox runs one plugin-sandbox replica; the wiring is
// pluginsandbox.Register.
package main

import (
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/service"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

func main() { service.Main(spec()) }

func spec() service.Spec {
	return service.Spec{
		Name:        "plugin-sandbox",
		Role:        bus.RolePlugin,
		HealthNames: []string{pluginv1.PluginService_ServiceDesc.ServiceName},
		Register:    pluginsandbox.Register,
	}
}
