package wasmhost

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero/api"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// ChannelCapabilities are the channel-capabilities flags a plugin
// advertises from channel_capabilities. For an unset flag the host uses the
// documented default and never calls the export: health reports healthy,
// typing indicators are no-ops.
type ChannelCapabilities struct {
	Health bool
	Typing bool
	// PollRefused: the plugin takes channel_poll_refused, and is told
	// of a polled message the host refused (PollMessage).
	PollRefused bool
}

// ChannelMessage is a message the plugin hands the host from
// channel_poll_message.
type ChannelMessage = abi.ChannelMessage

// SendMessage is an outbound message for channel_send.
type SendMessage = abi.SendMessage

// CallInfo attributes one call (logs, audit).
type CallInfo struct {
	CallID, Principal string
}

// Channel is a loaded channel plugin: one resident instance, refuelled
// before each call. An instance stopped by a limit or a trap is never
// resumed; the next call rebuilds it from host-owned state: the inbound
// queue (which the host owns and keeps) and, when the channel had been
// configured, a fresh channel_configure before the call.
type Channel struct {
	r    *resident
	name string
	caps ChannelCapabilities
	// senders are the instances Send runs on (built at their first
	// send, configured like r), apart from r: on r, one reply whose
	// endpoint hung held every other call of the channel (its polls,
	// the other conversations' answers and notices) for the whole call
	// limit. idle hands them out; one endpoint has at most one at a
	// time (endpoints), so a hung one holds one sender, never all.
	senders []*resident
	idle    chan *resident
	// contentBytes bounds a polled message's content
	// (SetPollContentBytes); 0 is DefaultPolledContentBytes.
	contentBytes atomic.Int64

	mu         sync.Mutex
	configured bool // a Configure succeeded; a rebuild re-runs it
	// endpoints are the reply endpoints with a send running or waiting,
	// each a one-token lock and its holders and waiters: bounded by the
	// channel's callers.
	endpoints map[string]*endpointLock
}

// channelSenders is how many instances a channel's sends run on.
const channelSenders = 3

type endpointLock struct {
	token chan struct{}
	users int
}

// LoadChannel compiles a channel plugin, builds its instance and reads its
// name and capability flags once (outside any service frame: config and
// secrets answer unavailable there). inbound is the host-fed queue the
// plugin drains from channel_poll_message; nil makes a new one.
func (h *Host) LoadChannel(ctx context.Context, spec PluginSpec, inbound *InboundQueue) (*Channel, error) {
	spec.World = WorldChannel
	if inbound == nil {
		inbound = NewInboundQueue(0, 0)
	}
	ch := &Channel{}
	r, err := h.loadResident(ctx, spec, inbound, func(ctx context.Context, r *resident) error {
		if err := r.metadata(ctx, abi.ExportChannelName, &ch.name); err != nil {
			return err
		}
		var flags []string
		if err := r.metadata(ctx, abi.ExportChannelCapabilities, &flags); err != nil {
			return err
		}
		set := flagSet(flags)
		ch.caps = ChannelCapabilities{Health: set[abi.FlagHealth], Typing: set[abi.FlagTyping], PollRefused: set[abi.FlagPollRefused]}
		// The export is optional (plugins built before it have neither
		// it nor the flag), so checkABI does not ask for it: a flag
		// without it would fail every refusal's call instead.
		fn, ok := r.c.mod.ExportedFunctions()[abi.ExportChannelPollRefused]
		if ch.caps.PollRefused && !ok {
			return fmt.Errorf("%w: channel_capabilities has %q but the module does not export %s", ErrABI, abi.FlagPollRefused, abi.ExportChannelPollRefused)
		}
		// Of another type, every word failed, and one returning no
		// value made the host index a result it did not have (a panic
		// of the sandbox at the first refusal).
		if ch.caps.PollRefused && !hasSignature(fn, []api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}) {
			return fmt.Errorf("%w: %s must be (i32, i32) -> i64, not (%s) -> (%s)", ErrABI, abi.ExportChannelPollRefused,
				typeNames(fn.ParamTypes()), typeNames(fn.ResultTypes()))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if ch.name == "" {
		r.close()
		_ = r.c.mod.Close(ctx)
		return nil, fmt.Errorf("%w: channel_name is empty", ErrABI)
	}
	ch.r = r
	r.onBuild = ch.reconfigure
	ch.endpoints = map[string]*endpointLock{}
	ch.idle = make(chan *resident, channelSenders)
	for range channelSenders {
		// No inbound queue: a send that polled would take a message
		// the channel's poll never sees.
		s := newResident(h, r.c, nil)
		s.onBuild = func(ctx context.Context) error { return ch.configureOn(ctx, s) }
		ch.senders = append(ch.senders, s)
		ch.idle <- s
	}
	return ch, nil
}

// hasSignature reports whether fn takes params and returns results.
func hasSignature(fn api.FunctionDefinition, params, results []api.ValueType) bool {
	return slices.Equal(fn.ParamTypes(), params) && slices.Equal(fn.ResultTypes(), results)
}

// typeNames is types as the text format writes them.
func typeNames(types []api.ValueType) string {
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = api.ValueTypeName(t)
	}
	return strings.Join(names, ", ")
}

// Name is the channel's name, read at load.
func (c *Channel) Name() string { return c.name }

// Capabilities are the flags read at load.
func (c *Channel) Capabilities() ChannelCapabilities { return c.caps }

// Inbound is the host-fed queue: the host's listener pushes received
// messages into it; it survives instance rebuilds.
func (c *Channel) Inbound() *InboundQueue { return c.r.inbound }

// PluginName is the package name of the plugin.
func (c *Channel) PluginName() string { return c.r.c.spec.Name }

// Configure runs channel_configure, which reads its config through
// config_get and secrets_get at the point of use (it takes no argument).
func (c *Channel) Configure(ctx context.Context, info CallInfo) error {
	if err := c.r.callSmall(ctx, abi.ExportChannelConfigure, nil, frameSpan{callID: info.CallID, principal: info.Principal}, true, nil); err != nil {
		return err
	}
	c.mu.Lock()
	c.configured = true
	c.mu.Unlock()
	return nil
}

// reconfigure runs on a rebuilt instance, under the instance lock and the
// deadline of the call that needed it.
func (c *Channel) reconfigure(ctx context.Context) error { return c.configureOn(ctx, c.r) }

// configureOn runs channel_configure on r's new instance once the
// channel has been configured, under r's lock.
func (c *Channel) configureOn(ctx context.Context, r *resident) error {
	c.mu.Lock()
	configured := c.configured
	c.mu.Unlock()
	if !configured {
		return nil
	}
	var derr error
	if err := r.callLockedRead(ctx, abi.ExportChannelConfigure, nil, frameSpan{}, func(view []byte) {
		derr = decodeSmall(abi.ExportChannelConfigure, view, nil)
	}); err != nil {
		return err
	}
	return derr
}

// Send delivers one message through the plugin, on one of its sending
// instances, never the one that polls. It waits, as long as ctx allows,
// for the sends to the same endpoint (recipient and thread) ahead of it,
// then for a free sending instance; the call itself runs within
// plugins.limits.call_timeout_ms. A hung endpoint thus holds its own
// sends and one instance, and the channel's polls and other endpoints'
// sends go on.
func (c *Channel) Send(ctx context.Context, info CallInfo, msg SendMessage) error {
	arg, err := guestJSON(msg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrABI, err)
	}
	release, err := c.holdEndpoint(ctx, msg.Recipient+"\x00"+msg.ThreadID)
	if err != nil {
		return err
	}
	defer release()
	var sender *resident
	select {
	case sender = <-c.idle:
	case <-ctx.Done():
		return ctxFailure(ctx, c.r.h.cfg.Limits)
	}
	defer func() { c.idle <- sender }()
	s := sender
	if !s.built(ctx) && !c.r.h.slots.spare() {
		// No instance to send on, and none free to build one
		// (plugins.limits.max_instances reached): waiting for one
		// failed every answer where the polling instance can send, as
		// it did before.
		s = c.r
	}
	var derr error
	if err := s.callAfterWait(ctx, abi.ExportChannelSend, arg, frameSpan{callID: info.CallID, principal: info.Principal}, true, func(view []byte) {
		derr = decodeSmall(abi.ExportChannelSend, view, nil)
	}); err != nil {
		return err
	}
	return derr
}

// built reports whether r has an instance (none before its first call,
// or after a failure), waiting within ctx for its lock.
func (r *resident) built(ctx context.Context) bool {
	if r.acquireLock(ctx) != nil {
		return false
	}
	defer r.releaseLock()
	return r.in != nil
}

// holdEndpoint waits within ctx until no other send to endpoint runs,
// and returns what ends this one's turn.
func (c *Channel) holdEndpoint(ctx context.Context, endpoint string) (func(), error) {
	c.mu.Lock()
	l := c.endpoints[endpoint]
	if l == nil {
		l = &endpointLock{token: make(chan struct{}, 1)}
		c.endpoints[endpoint] = l
	}
	l.users++
	c.mu.Unlock()
	leave := func() {
		c.mu.Lock()
		if l.users--; l.users == 0 {
			delete(c.endpoints, endpoint)
		}
		c.mu.Unlock()
	}
	select {
	case l.token <- struct{}{}:
	case <-ctx.Done():
		leave()
		return nil, ctxFailure(ctx, c.r.h.cfg.Limits)
	}
	return func() {
		<-l.token
		leave()
	}, nil
}

// SetPollContentBytes sets the bound of a polled message's content (the
// binding's channels.plugin.<alias>.max_content_kb): n bytes, within 1
// and MaxPolledContentBytes; 0 is DefaultPolledContentBytes. It applies
// from the next poll.
func (c *Channel) SetPollContentBytes(n int) {
	c.contentBytes.Store(int64(min(max(n, 0), MaxPolledContentBytes)))
}

// PollContentBytes is the bound of a polled message's content.
func (c *Channel) PollContentBytes() int {
	if n := int(c.contentBytes.Load()); n > 0 {
		return n
	}
	return DefaultPolledContentBytes
}

// PollMessage asks the plugin for its next message; the plugin drains the
// inbound queue (inbound_poll, inbound_pending) to produce it. It returns
// nil when there is none. Like Send, it waits for the instance within
// ctx, and runs within the call limit. The message is read from the
// guest's memory within its bounds (decodePoll): PollContentBytes of
// content, polledFieldBytes of each other string; past them the poll
// fails with a *PollRefusedError, saying which and how long, and holding
// the message's sender, reply target and thread when they were read
// within their bounds, so that the caller may tell the sender.
//
// A plugin with the poll_refused flag is told of the refusal before
// anything else runs on its instance (tellRefused): a plugin that
// answers a message until it knows what became of it answered a refused
// one at every poll, and its channel took nothing more.
func (c *Channel) PollMessage(ctx context.Context, info CallInfo) (*ChannelMessage, error) {
	var (
		msg  *ChannelMessage
		derr error
	)
	content := c.PollContentBytes()
	span := frameSpan{callID: info.CallID, principal: info.Principal}
	r := c.r
	if r.h.closed.Load() {
		return nil, ErrClosed
	}
	if err := r.acquireLock(ctx); err != nil {
		return nil, err
	}
	defer r.releaseLock()
	// Each call its own deadline, counted from when the instance is
	// free, as callAfterWait counts it.
	cctx, cancel := r.h.callContext(ctx)
	err := r.callHeldRead(cctx, abi.ExportChannelPollMessage, nil, span, true, func(view []byte) {
		msg, derr = decodePoll(view, content)
	})
	cancel()
	if err != nil {
		return nil, err
	}
	// decodePoll returns a refusal unwrapped; an assertion, unlike
	// errors.As, costs a poll nothing.
	if refused, ok := derr.(*PollRefusedError); ok && c.caps.PollRefused {
		refused.TellErr = c.tellRefused(ctx, refused, span)
		refused.Told = refused.TellErr == nil
	}
	return msg, derr
}

// tellRefused calls channel_poll_refused on the instance whose poll
// answered the message refused, under a deadline of its own; the caller
// holds the instance's lock. The call's frame has no inbound queue: a
// message the plugin took from it there would be tied to the refused
// one, and dropped from the spool with it.
func (c *Channel) tellRefused(ctx context.Context, refused *PollRefusedError, span frameSpan) error {
	r := c.r
	if r.in == nil {
		return fmt.Errorf("%w: the instance that answered the message is gone", ErrUnavailable)
	}
	m := refused.Msg
	if m == nil {
		m = &ChannelMessage{}
	}
	arg, err := guestJSON(abi.PollRefusal{ID: m.ID, Sender: m.Sender, ReplyTarget: m.ReplyTarget, ThreadID: m.ThreadID,
		Timestamp: m.Timestamp, Field: refused.Field, Bytes: refused.Size, Bound: refused.Bound})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrABI, err)
	}
	ctx, cancel := r.h.callContext(ctx)
	defer cancel()
	var derr error
	if err := r.callLockedReadIn(ctx, nil, abi.ExportChannelPollRefused, arg, span, func(view []byte) {
		derr = decodeSmall(abi.ExportChannelPollRefused, view, nil)
	}); err != nil {
		return err
	}
	return derr
}

// ResetPoll drops the instance the channel polls on, so that the next
// poll builds a fresh one, configured again, as after a trap: what the
// plugin kept in its memory is gone, the inbound queue (the host's) is
// not. The sending instances are left as they are: they keep nothing
// of a poll. It waits, within ctx, for a call running there to end.
func (c *Channel) ResetPoll(ctx context.Context) error { return c.r.replace(ctx, false) }

// Health reports whether the channel is healthy. Without the health flag it
// is true and the plugin is not called.
func (c *Channel) Health(ctx context.Context) (bool, error) {
	if !c.caps.Health {
		return true, nil
	}
	var (
		ok   bool
		derr error
	)
	if err := c.r.callRead(ctx, abi.ExportChannelHealth, nil, frameSpan{}, true, func(view []byte) { ok, derr = decodeHealth(view) }); err != nil {
		return false, err
	}
	return ok, derr
}

// StartTyping and StopTyping drive a typing indicator. Without the typing
// flag they do nothing and the plugin is not called.
func (c *Channel) StartTyping(ctx context.Context, recipient string) error {
	return c.typing(ctx, abi.ExportChannelStartTyping, recipient)
}

// StopTyping: see StartTyping.
func (c *Channel) StopTyping(ctx context.Context, recipient string) error {
	return c.typing(ctx, abi.ExportChannelStopTyping, recipient)
}

func (c *Channel) typing(ctx context.Context, export, recipient string) error {
	if !c.caps.Typing {
		return nil
	}
	arg, _ := json.Marshal(abi.TypingArgs{Recipient: recipient})
	return c.r.callSmall(ctx, export, arg, frameSpan{}, true, nil)
}

// Close waits for a running call, closes the instance and releases the
// compiled module. The inbound queue is the caller's to keep.
func (c *Channel) Close(ctx context.Context) error {
	c.r.close()
	for _, s := range c.senders {
		s.close()
	}
	return c.r.c.mod.Close(ctx)
}
