// Package channel implements the channel world of the Clawmesh plugin ABI
// for Go plugins: register one Channel from an init function.
//
// A channel runs without a listener of its own: the host runs it and feeds
// received messages into the channel's inbound queue, which the plugin
// drains from PollMessage with Poll and Pending. The instance is long-lived
// but may be rebuilt at any time (after a trap or a limit): keep no state
// you cannot lose, and resolve config (pdk.Config) and secrets (pdk.Secret)
// at the point of use in Configure and every operational call, never
// keeping them.
package channel
