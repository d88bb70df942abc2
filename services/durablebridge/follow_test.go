package durablebridge

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// A streamed chunk of a shown pane's known turn leaves every ask as it
// was (the follower then skips its walk over the asks), anything else may
// not; and an ask still expires on time while its session streams a chunk
// a millisecond.
func TestAskExpiresWhileItsSessionStreams(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.cfg.ReconcileEvery = time.Hour
	a := testAsk("s-1", "tc-1")
	a.expires = time.Now().Add(200 * time.Millisecond)
	w.addPane("s-1", "main", 1, a) // its turn is turn-1
	f := w.b.follower

	chunk := func(seq int64) bus.Update {
		return bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: seq,
			JSON: []byte(`{"turn_id":"turn-1","text":"x"}`)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	if !f.apply(ctx, chunk(1)) {
		t.Fatal("a chunk of the known turn reported as changing asks")
	}
	trimmed := bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_HISTORY_TRIMMED, Seq: 2,
		JSON: []byte(`{"turn_id":"turn-1","dropped_messages":3}`)}
	if f.apply(ctx, trimmed) {
		t.Fatal("an update other than a chunk reported as leaving asks alone")
	}

	done := make(chan struct{})
	go func() { defer close(done); f.follow(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second) // a failure bound, not a figure
	for seq := int64(3); ; seq++ {
		select {
		case f.updates <- chunk(seq):
		case <-time.After(time.Second):
		}
		expired := false
		w.b.layout.read("s-1", func(*pane) { expired = a.expired })
		if expired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ask did not expire while chunks streamed")
		}
		time.Sleep(time.Millisecond)
	}
	var last int64
	w.b.layout.read("s-1", func(p *pane) { last = p.lastSeq })
	if last < 4 {
		t.Fatalf("chunks not applied meanwhile: last seq %d", last)
	}
}
