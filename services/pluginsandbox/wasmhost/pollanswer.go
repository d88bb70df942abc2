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
	// polledContentBytes bounds a polled message's content: what one
	// message posted to a channel's listener may carry (1 MiB).
	polledContentBytes = 1 << 20
	// polledFieldBytes bounds each of a polled message's id, sender,
	// reply target and thread.
	polledFieldBytes = 16 << 10
	// pollWholeBytes bounds a poll answer that readPoll does not read (a
	// key it does not know, or in another case, or twice), which
	// encoding/json decodes whole: a message at its bounds, with room.
	pollWholeBytes = 2 << 20
)

// pollFields are the keys of a polled message, as the guest library
// writes them, and the bound of each string.
var pollFields = [...]struct {
	name  string
	bound int
}{
	{"id", polledFieldBytes}, {"sender", polledFieldBytes}, {"reply_target", polledFieldBytes},
	{"content", polledContentBytes}, {"thread_id", polledFieldBytes}, {"timestamp", 0},
}

// decodePoll reads channel_poll_message's answer: an err with its
// message cut (errAnswerCut); a message or null read by readPoll, its
// strings kept only within their bounds; any other shape up to
// pollWholeBytes as decodeResult reads it. A message past a bound is
// refused, naming the field and its size.
func decodePoll(view []byte) (*ChannelMessage, error) {
	const export = abi.ExportChannelPollMessage
	if err, ok := errAnswerCut(view); ok {
		return nil, err
	}
	if msg, err, ok := readPoll(view); ok {
		return msg, err
	}
	if len(view) > pollWholeBytes {
		return nil, fmt.Errorf("%w: %s answered %d bytes in a shape the host reads whole only up to %d bytes (a message of the keys %s writes, each once, is read up to the result's bound)",
			ErrABI, export, len(view), pollWholeBytes, "plugins/pdk/channel")
	}
	var msg *ChannelMessage
	if err := decodeResult(export, view, &msg); err != nil {
		return nil, err
	}
	if msg == nil {
		return nil, nil
	}
	for i, s := range []string{msg.ID, msg.Sender, msg.ReplyTarget, msg.Content, msg.ThreadID} {
		if f := pollFields[i]; len(s) > f.bound {
			return nil, pollFieldTooBig(f.name, len(s), f.bound)
		}
	}
	return msg, nil
}

func pollFieldTooBig(field string, size, bound int) error {
	return fmt.Errorf("%w: %s answered a message whose %s is %d bytes; a polled message's %s is at most %d",
		ErrABI, abi.ExportChannelPollMessage, field, size, field, bound)
}

// readPoll reads {"ok":null} and {"ok":M}, JSON's whitespace allowed
// between tokens, M an object of pollFields' keys in any order, each at
// most once, a string (timestamp an integer) or null, as encoding/json
// reads them. Each string is kept only up to its bound, the rest
// measured: past it, err says so (ok is true). ok is false for any other
// answer, or one encoding/json refuses, which decodeResult then reads or
// names.
func readPoll(b []byte) (msg *ChannelMessage, err error, ok bool) {
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
	to := [...]*string{&m.ID, &m.Sender, &m.ReplyTarget, &m.Content, &m.ThreadID}
	var seen [len(pollFields)]bool
	b = skipSpace(b)
	if rest, found := cutPrefix(b, "}"); found {
		return m, nil, end(rest, "}")
	}
	for {
		// The longest key is 12 bytes; a longer one is no field.
		key, n, rest, ok := jsonstr.UnquoteStart(b, 16)
		if !ok || n > 16 {
			return nil, nil, false
		}
		i := 0
		for i < len(pollFields) && pollFields[i].name != key {
			i++
		}
		if i == len(pollFields) || seen[i] {
			return nil, nil, false
		}
		seen[i] = true
		if b, ok = cutPrefix(skipSpace(rest), ":"); !ok {
			return nil, nil, false
		}
		b = skipSpace(b)
		switch f := pollFields[i]; {
		case len(b) >= 4 && string(b[:4]) == "null":
			b = b[4:] // encoding/json leaves the field as it is
		case i == len(to): // timestamp
			n := jsonstr.NumberEnd(b, 0)
			if n < 0 {
				return nil, nil, false
			}
			t, perr := strconv.ParseInt(string(b[:n]), 10, 64)
			if perr != nil {
				return nil, nil, false
			}
			m.Timestamp, b = t, b[n:]
		default:
			s, total, rest, ok := jsonstr.UnquoteStart(b, f.bound)
			if !ok {
				return nil, nil, false
			}
			if total > f.bound {
				return nil, pollFieldTooBig(f.name, total, f.bound), true
			}
			*to[i], b = s, rest
		}
		b = skipSpace(b)
		if rest, found := cutPrefix(b, "}"); found {
			return m, nil, end(rest, "}")
		}
		if b, ok = cutPrefix(b, ","); !ok {
			return nil, nil, false
		}
		b = skipSpace(b)
	}
}

// end reports whether b is closer and JSON's whitespace around it.
func end(b []byte, closer string) bool {
	b, ok := cutPrefix(skipSpace(b), closer)
	return ok && len(skipSpace(b)) == 0
}
