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

// An update the pane already covers (queued while the pane was loaded
// from a view that includes it) is skipped: the pane is left as it was
// and no ask can have changed, so the follower does not walk the asks.
func TestCoveredUpdateIsSkipped(t *testing.T) {
	w := newWireBridge(t, false)
	w.addPane("s-1", "main", 1, testAsk("s-1", "tc-1"))
	f := w.b.follower
	ctx := context.Background()
	chunk := func(seq int64, text string) bus.Update {
		return bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: seq,
			JSON: []byte(`{"turn_id":"turn-1","text":"` + text + `"}`)}
	}
	if !f.apply(ctx, chunk(5, "new")) {
		t.Fatal("a chunk of the known turn reported as changing asks")
	}
	reply := func() (text string, last int64) {
		w.b.layout.read("s-1", func(p *pane) {
			if it := p.itemByID["turn-1:reply"]; it != nil {
				text = string(it.text)
			}
			last = p.lastSeq
		})
		return text, last
	}
	text, last := reply()
	for _, seq := range []int64{5, 3} {
		if !f.apply(ctx, chunk(seq, "covered")) {
			t.Fatalf("update %d, already covered, reported as changing asks", seq)
		}
		if gotText, gotLast := reply(); gotText != text || gotLast != last {
			t.Fatalf("update %d, already covered, changed the pane: %q seq %d, was %q seq %d", seq, gotText, gotLast, text, last)
		}
	}
}
