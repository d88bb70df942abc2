package wasmhost

import (
	"fmt"
	"strconv"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// Bounds on a polled message. A poll answers one message (or none), which
// the sandbox hands to a session as a prompt and keeps in its backlog
// until then: up to 16 MiB of content was copied out and decoded whole
// (some 34 MB a poll) and passed on.
const (
	// DefaultPolledContentBytes bounds a polled message's content unless
	// the channel sets another (Channel.SetPollContentBytes): what one
	// message posted to a channel's listener may carry (1 MiB).
	DefaultPolledContentBytes = 1 << 20
	// MaxPolledContentBytes is the most a channel's content bound may
	// be (channels.plugin.<alias>.max_content_kb): 8 MiB, the prompt
	// the gateway takes in one frame by default. The polled backlog is
	// bounded at 16 MiB before a poll (room), so it holds at most that
	// and one message more; the message also has to fit the guest's 16
	// MiB result and a 16 MiB gRPC message to the session service.
	MaxPolledContentBytes = 8 << 20
	// polledFieldBytes bounds each of a polled message's id, sender,
	// reply target and thread.
	polledFieldBytes = 16 << 10
	// pollWholeSlack is what a poll answer that readPoll does not read
	// (a key it does not know, or in another case, or twice) may hold
	// past the content's bound: encoding/json decodes it whole, up to a
	// message at its bounds, with room.
	pollWholeSlack = 1 << 20
)

// contentField is pollFields' index of the content, whose bound is the
// channel's (the entry's is the default).
const contentField = 3

// pollFields are the keys of a polled message, as the guest library
// writes them, and the bound of each string.
var pollFields = [...]struct {
	name  string
	bound int
}{
	{"id", polledFieldBytes}, {"sender", polledFieldBytes}, {"reply_target", polledFieldBytes},
	{"content", DefaultPolledContentBytes}, {"thread_id", polledFieldBytes}, {"timestamp", 0},
}

// fieldBound is the bound of pollFields[i] for a content bound of content.
func fieldBound(i, content int) int {
	if i == contentField {
		return content
	}
	return pollFields[i].bound
}

// PollRefusedError is a polled message refused for its size: Field is
// the first string read past its bound, Size its length and Bound the
// bound. Msg is what was read of the message within the bounds, so that
// its sender can be told: its id, sender, reply target, thread and
// timestamp, each empty when it was itself past its bound, and never
// its content. It wraps ErrABI.
type PollRefusedError struct {
	Field       string
	Size, Bound int
	Msg         *ChannelMessage
	// Told is set when the plugin took channel_poll_refused's word of
	// the refusal (it has the poll_refused flag, and the call answered
	// ok); TellErr is why a plugin with the flag was not told.
	Told    bool
	TellErr error
}

func (e *PollRefusedError) Error() string {
	return fmt.Sprintf("%v: %s answered a message whose %s is %d bytes; a polled message's %s is at most %d",
		ErrABI, abi.ExportChannelPollMessage, e.Field, e.Size, e.Field, e.Bound)
}

// Unwrap makes a refusal an ErrABI.
func (e *PollRefusedError) Unwrap() error { return ErrABI }

// decodePoll reads channel_poll_message's answer: an err with its
// message cut (errAnswerCut); a message or null read by readPoll, its
// strings kept only within their bounds (content, the content's); any
// other shape up to content+pollWholeSlack as decodeResult reads it. A
// message past a bound is refused with a *PollRefusedError naming the
// field and its size, and holding what was read within the bounds.
func decodePoll(view []byte, content int) (*ChannelMessage, error) {
	const export = abi.ExportChannelPollMessage
	if err, ok := errAnswerCut(view); ok {
		return nil, err
	}
	if msg, err, ok := readPoll(view, content); ok {
		return msg, err
	}
	if whole := content + pollWholeSlack; len(view) > whole {
		return nil, fmt.Errorf("%w: %s answered %d bytes in a shape the host reads whole only up to %d bytes (a message of the keys %s writes, each once, is read up to the result's bound)",
			ErrABI, export, len(view), whole, "plugins/pdk/channel")
	}
	var msg *ChannelMessage
	if err := decodeResult(export, view, &msg); err != nil {
		return nil, err
	}
	if msg == nil {
		return nil, nil
	}
	var refused *PollRefusedError
	to := messageStrings(msg)
	for i, s := range to {
		if b := fieldBound(i, content); len(*s) > b {
			if refused == nil {
				refused = &PollRefusedError{Field: pollFields[i].name, Size: len(*s), Bound: b, Msg: msg}
			}
			*s = ""
		}
	}
	if refused != nil {
		msg.Content = ""
		return nil, refused
	}
	return msg, nil
}

// messageStrings are m's strings in pollFields' order.
func messageStrings(m *ChannelMessage) [contentField + 2]*string {
	return [...]*string{&m.ID, &m.Sender, &m.ReplyTarget, &m.Content, &m.ThreadID}
}

// readPoll reads {"ok":null} and {"ok":M}, JSON's whitespace allowed
// between tokens, M an object of pollFields' keys in any order, each at
// most once, a string (timestamp an integer) or null, as encoding/json
// reads them. Each string is kept only up to its bound (content, the
// content's), the rest measured: past it, err is a *PollRefusedError
// (ok is true), and the message is read on for its other fields (a
// content after the refusal measured only), which the refusal holds. ok
// is false for any other answer, or one encoding/json refuses, which
// decodeResult then reads or names, whether a field was refused before
// or not.
func readPoll(b []byte, content int) (msg *ChannelMessage, err error, ok bool) {
	for _, tok := range []string{"{", `"ok"`, ":"} {
		if b, ok = cutPrefix(skipSpace(b), tok); !ok {
			return nil, nil, false
		}
	}
	b = skipSpace(b)
	if rest, null := cutPrefix(b, "null"); null {
		return nil, nil, end(rest, "}")
	}
	if b, ok = cutPrefix(b, "{"); !ok {
		return nil, nil, false
	}
	m := &ChannelMessage{}
	to := messageStrings(m)
	var (
		seen    [len(pollFields)]bool
		refused *PollRefusedError
	)
	// fail ends a read of a shape readPoll does not read, a refusal
	// made before it too: decodeResult reads it (a key twice, the last
	// one within its bound, is a message encoding/json takes).
	fail := func() (*ChannelMessage, error, bool) { return nil, nil, false }
	// done ends a read that reached the message's end.
	done := func(rest []byte) (*ChannelMessage, error, bool) {
		if !end(rest, "}") {
			return fail()
		}
		if refused != nil {
			m.Content = ""
			refused.Msg = m
			return nil, refused, true
		}
		return m, nil, true
	}
	b = skipSpace(b)
	if rest, found := cutPrefix(b, "}"); found {
		return done(rest)
	}
	for {
		// The longest key is 12 bytes; a longer one is no field.
		key, n, rest, ok := jsonstr.UnquoteStart(b, 16)
		if !ok || n > 16 {
			return fail()
		}
		i := 0
		for i < len(pollFields) && pollFields[i].name != key {
			i++
		}
		if i == len(pollFields) || seen[i] {
			return fail()
		}
		seen[i] = true
		if b, ok = cutPrefix(skipSpace(rest), ":"); !ok {
			return fail()
		}
		b = skipSpace(b)
		switch bound := fieldBound(i, content); {
		case len(b) >= 4 && string(b[:4]) == "null":
			b = b[4:] // encoding/json leaves the field as it is
		case i == len(to): // timestamp
			n := jsonstr.NumberEnd(b, 0)
			if n < 0 {
				return fail()
			}
			t, perr := strconv.ParseInt(string(b[:n]), 10, 64)
			if perr != nil {
				return fail()
			}
			m.Timestamp, b = t, b[n:]
		default:
			keep := bound
			if refused != nil && i == contentField {
				keep = 0 // refused already: only the sender's fields are of use
			}
			s, total, rest, ok := jsonstr.UnquoteStart(b, keep)
			if !ok {
				return fail()
			}
			b = rest
			if total > bound {
				if refused == nil {
					refused = &PollRefusedError{Field: pollFields[i].name, Size: total, Bound: bound}
				}
				break
			}
			*to[i] = s
		}
		b = skipSpace(b)
		if rest, found := cutPrefix(b, "}"); found {
			return done(rest)
		}
		if b, ok = cutPrefix(b, ","); !ok {
			return fail()
		}
		b = skipSpace(b)
	}
}

// end reports whether b is closer and JSON's whitespace around it.
func end(b []byte, closer string) bool {
	b, ok := cutPrefix(skipSpace(b), closer)
	return ok && len(skipSpace(b)) == 0
}
