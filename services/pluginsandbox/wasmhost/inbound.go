package wasmhost

import (
	"errors"
	"fmt"
	"sync"
)

// ErrInboundFull is returned by InboundQueue.Push when the queue is full.
var ErrInboundFull = errors.New("wasmhost: inbound queue full")

// InboundQueue is the host-fed queue of a channel plugin. The host's
// listener pushes each received message; the plugin drains it from its
// poll-message export through the inbound_poll and inbound_pending imports.
// It is safe for concurrent use.
type InboundQueue struct {
	mu       sync.Mutex
	msgs     [][]byte
	tags     []string // msgs' tags (PushTagged), in step with msgs
	bytes    int64    // the queued messages' lengths together
	max      int
	maxBytes int64
	// popped are the tags of the messages the plugin took since the
	// last TakePopped: the plugin runs one call at a time, so after a
	// poll they are what that poll read. At most max: every one was
	// queued.
	popped []string
}

// NewInboundQueue returns a queue holding at most max messages and at
// most maxBytes of them together (non-positive: 1024 messages, 16 MiB).
// The byte bound is the one that holds memory: a count alone let
// messages of the listener's largest size fill a sandbox's heap.
func NewInboundQueue(max int, maxBytes int64) *InboundQueue {
	if max <= 0 {
		max = 1024
	}
	if maxBytes <= 0 {
		maxBytes = 16 << 20
	}
	return &InboundQueue{max: max, maxBytes: maxBytes}
}

// Push queues one message, which must be a JSON object.
func (q *InboundQueue) Push(msg any) error { return q.PushTagged(msg, "") }

// PushTagged queues one message with a tag of the caller's (non-empty
// to be told by TakePopped when the plugin takes the message).
func (q *InboundQueue) PushTagged(msg any, tag string) error {
	b, err := guestJSON(msg)
	if err != nil {
		return fmt.Errorf("wasmhost: inbound message: %w", err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) >= q.max || q.bytes+int64(len(b)) > q.maxBytes {
		return ErrInboundFull
	}
	q.msgs = append(q.msgs, b)
	q.tags = append(q.tags, tag)
	q.bytes += int64(len(b))
	return nil
}

// TakePopped returns the tags of the messages the plugin took since the
// last call, oldest first, and forgets them.
func (q *InboundQueue) TakePopped() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.popped
	q.popped = nil
	return out
}

// Pending returns the number of queued messages.
func (q *InboundQueue) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs)
}

// popIfFits returns the head message's length and, when it fits in
// capacity, removes and returns it.
func (q *InboundQueue) popIfFits(capacity uint32) (msg []byte, size int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) == 0 {
		return nil, 0
	}
	head := q.msgs[0]
	if uint32(len(head)) > capacity {
		return nil, len(head)
	}
	q.msgs[0] = nil
	q.msgs = q.msgs[1:]
	if tag := q.tags[0]; tag != "" && len(q.popped) < q.max {
		q.popped = append(q.popped, tag)
	}
	q.tags = q.tags[1:]
	q.bytes -= int64(len(head))
	return head, len(head)
}
