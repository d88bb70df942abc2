// Package observer implements the observer world of the Clawmesh plugin
// ABI for Go plugins (an observability backend, seed 003's "observer"
// capability): register one Observer from an init function.
//
// The host hands the observer its events (tool calls, channel messages,
// plugin loads) one at a time from a bounded queue; events that arrive
// while the queue is full are dropped and counted by the host. The
// observer world imports only logging, like memory. The instance is
// long-lived; after a trap or a limit the host rebuilds it, empty.
package observer
