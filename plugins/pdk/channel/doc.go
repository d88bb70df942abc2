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
//
// A channel that implements RefusalTaker is told of a polled message the
// host refused for its size, right after the poll that answered it (the
// poll_refused flag and the channel_poll_refused export of
// plugins/ABI.md); one that holds a message until it knows what became
// of it drops it there, or its channel takes nothing more.
package channel
