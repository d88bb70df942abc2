package e2e

import "github.com/clawmesh/clawmesh/internal/rpcclient"

// The socket client of the tests is the project's one NDJSON client.
type (
	Client   = rpcclient.Client
	RPCError = rpcclient.RPCError
	Frame    = rpcclient.Frame
)

// Dial connects to a socket.
func Dial(path string) (*Client, error) { return rpcclient.Dial(path) }
