// Package memory implements the memory world of the Clawmesh plugin ABI for
// Go plugins: register one Memory from an init function.
//
// The memory world imports only logging: pdk.Config and pdk.Secret answer
// access-denied and pdk.Fetch is never bound (access-denied), whatever the
// manifest requests. The instance is long-lived; after a trap or a limit
// its owner rebuilds it, empty.
package memory
