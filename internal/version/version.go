// Package version holds Clawmesh's own version and the protocol version of
// the local socket.
package version

// Version is Clawmesh's release; the gateway reports it as server_version
// unless rpc.advertised_server_version is set.
const Version = "0.1.0"

// Protocol is the local socket's protocol_version.
const Protocol = 1
