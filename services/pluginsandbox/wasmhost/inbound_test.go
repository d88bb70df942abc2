package wasmhost

import (
	"errors"
	"strings"
	"testing"
)

// A channel's queue is bounded in bytes as well as in messages: 256
// messages of up to 1 MiB each let one sender with the listener's token
// queue 256 MiB in the sandbox, past the heap its GOMEMLIMIT and its
// container's limit allow. Past the byte bound Push refuses, and a
// drained message gives its room back.
func TestInboundQueueBoundsItsBytes(t *testing.T) {
	q := NewInboundQueue(100, 3000)
	big := map[string]string{"text": strings.Repeat("x", 1000)}
	for i := range 2 {
		if err := q.Push(big); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	if err := q.Push(big); !errors.Is(err, ErrInboundFull) {
		t.Fatalf("third 1 KB message into a 3,000-byte queue holding 2 KB: %v, want ErrInboundFull", err)
	}
	if q.Pending() != 2 {
		t.Fatalf("pending = %d, want 2", q.Pending())
	}
	if msg, _ := q.popIfFits(1 << 20); msg == nil {
		t.Fatal("nothing popped")
	}
	if err := q.Push(big); err != nil {
		t.Fatalf("push after a pop: %v", err)
	}
	// A message larger than the whole bound is refused outright, even
	// into an empty queue.
	if err := NewInboundQueue(100, 500).Push(big); !errors.Is(err, ErrInboundFull) {
		t.Fatalf("a 1 KB message into a 500-byte queue: %v", err)
	}
}
