// Package stack is the one table of the processes a Clawmesh stack runs:
// their names, the Go packages their binaries are built from, their bus
// identities and their start order. The launcher starts what it lists,
// the end-to-end helpers and `make build` build what it lists
// (`go run ./internal/stack/list`), and a test checks docker-compose.yml
// and the Kubernetes manifests against it.
package stack

import "github.com/clawmesh/clawmesh/internal/bus"

// Process is one process of the stack.
type Process struct {
	// Name is the binary's name, its gRPC socket's name (<data>/<Name>.sock)
	// and its log's name.
	Name string
	// Package is the Go package of its main, relative to the module root;
	// its last element is Name.
	Package string
	// Role is its identity on the bus.
	Role bus.Role
	// Scalable processes may run several replicas (--scale NAME=N).
	Scalable bool
	// Edge is the gateway: started once every service serves, stopped
	// first.
	Edge bool
}

// Services in start order, then the gateway.
var Processes = []Process{
	{Name: "config", Package: "./services/config/cmd/config", Role: bus.RoleConfig},
	{Name: "session", Package: "./services/session/cmd/session", Role: bus.RoleSession},
	{Name: "upload-staging", Package: "./services/uploadstaging/cmd/upload-staging", Role: bus.RoleUpload},
	{Name: "plugin-sandbox", Package: "./services/pluginsandbox/cmd/plugin-sandbox", Role: bus.RolePlugin, Scalable: true},
	{Name: "durable-bridge", Package: "./services/durablebridge/cmd/durable-bridge", Role: bus.RoleDurable},
	{Name: "gateway", Package: "./gateway/cmd/gateway", Role: bus.RoleGateway, Edge: true},
}

// CLI is the clawmesh command, which holds the launcher.
var CLI = Process{Name: "clawmesh", Package: "./cmd/clawmesh", Role: bus.RoleLauncher}

// Packages lists the packages of every binary, the CLI first.
func Packages() []string {
	out := []string{CLI.Package}
	for _, p := range Processes {
		out = append(out, p.Package)
	}
	return out
}

// Lookup returns the process named name.
func Lookup(name string) (Process, bool) {
	for _, p := range Processes {
		if p.Name == name {
			return p, true
		}
	}
	return Process{}, false
}
