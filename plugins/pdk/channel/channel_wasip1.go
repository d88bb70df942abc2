//go:build wasip1

package channel

import (
	"encoding/json"
	"unsafe"

	"github.com/clawmesh/clawmesh/plugins/pdk/internal/abi"
)

// Capabilities are the optional exports the plugin implements. For an
// unset flag the host uses its default and never calls the method: Health
// reports healthy, typing indicators do nothing.
type Capabilities struct {
	Health bool
	Typing bool
}

// Message is what PollMessage hands the host.
type Message struct {
	ID          string `json:"id"`
	Sender      string `json:"sender"`
	ReplyTarget string `json:"reply_target,omitempty"`
	Content     string `json:"content"`
	ThreadID    string `json:"thread_id,omitempty"`
	Timestamp   int64  `json:"timestamp,omitempty"`
}

// SendMessage is an outbound message.
type SendMessage struct {
	Recipient string `json:"recipient"`
	Content   string `json:"content"`
	ThreadID  string `json:"thread_id,omitempty"`
}

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
func Pending() int { return int(abi.InboundPending()) }

// Poll takes the next message the host queued (a JSON object whose shape
// is the host listener's), or reports false when the queue is empty.
func Poll() (json.RawMessage, bool) {
	b, n := abi.ReadGrowing(func(buf unsafe.Pointer, capacity uint32) int64 {
		return abi.InboundPoll(buf, capacity)
	})
	if n <= 0 {
		return nil, false
	}
	return b, true
}

//go:wasmexport channel_name
func channelName() uint64 { return abi.ReturnJSON(registered.Name()) }

//go:wasmexport channel_capabilities
func channelCapabilities() uint64 {
	caps := registered.Capabilities()
	flags := []string{}
	if caps.Health {
		flags = append(flags, "health")
	}
	if caps.Typing {
		flags = append(flags, "typing")
	}
	return abi.ReturnJSON(flags)
}

//go:wasmexport channel_configure
func channelConfigure() uint64 { return abi.Result(nil, registered.Configure()) }

//go:wasmexport channel_send
func channelSend(ptr, size uint32) uint64 {
	var msg SendMessage
	if err := json.Unmarshal(abi.Take(ptr, size), &msg); err != nil {
		return abi.ReturnErr("malformed message: " + err.Error())
	}
	return abi.Result(nil, registered.Send(msg))
}

//go:wasmexport channel_poll_message
func channelPollMessage() uint64 { return abi.Result(registered.PollMessage()) }

//go:wasmexport channel_health
func channelHealth() uint64 { return abi.ReturnJSON(registered.Health()) }

type typingArg struct {
	Recipient string `json:"recipient"`
}

//go:wasmexport channel_start_typing
func channelStartTyping(ptr, size uint32) uint64 {
	var a typingArg
	if err := json.Unmarshal(abi.Take(ptr, size), &a); err != nil {
		return abi.ReturnErr("malformed argument")
	}
	return abi.Result(nil, registered.StartTyping(a.Recipient))
}

//go:wasmexport channel_stop_typing
func channelStopTyping(ptr, size uint32) uint64 {
	var a typingArg
	if err := json.Unmarshal(abi.Take(ptr, size), &a); err != nil {
		return abi.ReturnErr("malformed argument")
	}
	return abi.Result(nil, registered.StopTyping(a.Recipient))
}
