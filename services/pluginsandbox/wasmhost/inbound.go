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
	mu   sync.Mutex
	msgs [][]byte
	max  int
}

// NewInboundQueue returns a queue holding at most max messages.
func NewInboundQueue(max int) *InboundQueue {
	if max <= 0 {
		max = 1024
	}
	return &InboundQueue{max: max}
}

// Push queues one message, which must be a JSON object.
func (q *InboundQueue) Push(msg any) error {
	b, err := guestJSON(msg)
	if err != nil {
		return fmt.Errorf("wasmhost: inbound message: %w", err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) >= q.max {
		return ErrInboundFull
	}
	q.msgs = append(q.msgs, b)
	return nil
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
	return head, len(head)
}
