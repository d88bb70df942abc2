//go:build wasip1

package channel

import (
	"encoding/json"
	"unsafe"

	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/plugins/pdk/internal/guest"
)

// Capabilities are the optional exports the plugin implements. For an
// unset flag the host uses its default and never calls the method: Health
// reports healthy, typing indicators do nothing.
type Capabilities struct {
	Health bool
	Typing bool
}

// Message is what PollMessage hands the host.
type Message = abi.ChannelMessage

// SendMessage is an outbound message.
type SendMessage = abi.SendMessage

// Channel is one messaging channel. Name and Capabilities are read once at
// load, outside any service frame (config and secrets are unavailable
// there). A returned error is the channel's own failure, reported to the
// host as such.
type Channel interface {
	Name() string
	Capabilities() Capabilities
	Configure() error
	Send(msg SendMessage) error
	// PollMessage returns the next message, or nil when there is none.
	PollMessage() (*Message, error)
	Health() bool
	StartTyping(recipient string) error
	StopTyping(recipient string) error
}

// Refusal is what the host tells a channel of a polled message it
// refused for its size.
type Refusal = abi.PollRefusal

// RefusalTaker is a Channel that hears of the messages the host refuses
// (the poll_refused flag, advertised for it). The host refuses a polled
// message past its bounds (content past the alias's max_content_kb, an
// id, sender, reply target or thread past 16 KiB), tells its sender, and
// will not take it answered again: a channel that answers a message
// until it knows what became of it must drop it here, or it stalls.
// A channel without it is not told, as before the flag existed.
type RefusalTaker interface {
	// PollRefused is called right after the PollMessage whose message
	// the host refused, before any other call of the channel's. The
	// inbound queue reads empty here (Poll, Pending). An error is
	// logged by the host, nothing more.
	PollRefused(r Refusal) error
}

// NoTyping and AlwaysHealthy are stubs to embed for the optional methods a
// channel does not advertise.
type NoTyping struct{}

// StartTyping does nothing.
func (NoTyping) StartTyping(string) error { return nil }

// StopTyping does nothing.
func (NoTyping) StopTyping(string) error { return nil }

// AlwaysHealthy reports healthy.
type AlwaysHealthy struct{}

// Health reports true.
func (AlwaysHealthy) Health() bool { return true }

var registered Channel

// Register installs the plugin's channel. Call it once, from init.
func Register(c Channel) { registered = c }

// Pending returns the number of messages waiting in the inbound queue.
func Pending() int { return int(guest.InboundPending()) }

// Poll takes the next message the host queued (a JSON object whose shape
// is the host listener's), or reports false when the queue is empty.
func Poll() (json.RawMessage, bool) {
	b, n := guest.ReadGrowing(func(buf unsafe.Pointer, capacity uint32) int64 {
		return guest.InboundPoll(buf, capacity)
	})
	if n <= 0 {
		return nil, false
	}
	return b, true
}

//go:wasmexport channel_name
func channelName() uint64 { return guest.ReturnJSON(registered.Name()) }

//go:wasmexport channel_capabilities
func channelCapabilities() uint64 {
	caps := registered.Capabilities()
	flags := []string{}
	if caps.Health {
		flags = append(flags, abi.FlagHealth)
	}
	if caps.Typing {
		flags = append(flags, abi.FlagTyping)
	}
	if _, ok := registered.(RefusalTaker); ok {
		flags = append(flags, abi.FlagPollRefused)
	}
	return guest.ReturnJSON(flags)
}

//go:wasmexport channel_configure
func channelConfigure() uint64 { return guest.Result(nil, registered.Configure()) }

//go:wasmexport channel_send
func channelSend(ptr, size uint32) uint64 {
	var msg SendMessage
	if err := json.Unmarshal(guest.Take(ptr, size), &msg); err != nil {
		return guest.ReturnErr("malformed message: " + err.Error())
	}
	return guest.Result(nil, registered.Send(msg))
}

//go:wasmexport channel_poll_message
func channelPollMessage() uint64 { return guest.Result(registered.PollMessage()) }

// channelPollRefused is exported whatever the channel: the host calls it
// only when the flag says the channel takes it.
//
//go:wasmexport channel_poll_refused
func channelPollRefused(ptr, size uint32) uint64 {
	var r Refusal
	if err := json.Unmarshal(guest.Take(ptr, size), &r); err != nil {
		return guest.ReturnErr("malformed refusal: " + err.Error())
	}
	t, ok := registered.(RefusalTaker)
	if !ok {
		return guest.Result(nil, nil)
	}
	return guest.Result(nil, t.PollRefused(r))
}

//go:wasmexport channel_health
func channelHealth() uint64 { return guest.ReturnJSON(registered.Health()) }

//go:wasmexport channel_start_typing
func channelStartTyping(ptr, size uint32) uint64 {
	var a abi.TypingArgs
	if err := json.Unmarshal(guest.Take(ptr, size), &a); err != nil {
		return guest.ReturnErr("malformed argument")
	}
	return guest.Result(nil, registered.StartTyping(a.Recipient))
}

//go:wasmexport channel_stop_typing
func channelStopTyping(ptr, size uint32) uint64 {
	var a abi.TypingArgs
	if err := json.Unmarshal(guest.Take(ptr, size), &a); err != nil {
		return guest.ReturnErr("malformed argument")
	}
	return guest.Result(nil, registered.StopTyping(a.Recipient))
}
