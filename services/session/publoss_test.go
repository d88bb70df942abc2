package session

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// While the bus is down and the connection's buffer for it is full, every
// update fails to publish: one warning says so for the run, not one per
// update (one fast turn logged thousands a second, rotating out of the
// log the lines that said why), and one line says when updates go out
// again, with how many were lost.
func TestFailedPublishesLogOncePerRun(t *testing.T) {
	bus := testenv.StartNATS(t)
	nc, err := natsutil.Connect(natsutil.Options{URL: bus.URL(), Name: "session", Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	core, logs := observer.New(zap.InfoLevel)
	h := newHarness(t, func(c *Config) { c.NATS, c.Log = nc, zap.New(core) })
	id := h.newSession(alice, "default")
	row, err := h.srv.store.session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ls, release := h.srv.hold(context.Background(), row)
	defer release()

	bus.Shutdown()
	eventually(t, func() error {
		if nc.IsConnected() {
			return errors.New("the bus connection was not seen dropped")
		}
		return nil
	})
	// Twice what nats.go buffers for the server's return (8 MB): the
	// rest fail.
	text := strings.Repeat("x", 4096)
	for range 4096 {
		h.srv.publishChunk(ls, UpdateMessageChunk, "t-1", text)
	}
	ls.pubMu.Lock()
	lost := ls.pubFailed
	ls.pubMu.Unlock()
	if lost == 0 {
		t.Fatal("no update failed to publish with the bus down: the test published too little")
	}
	if n := logs.FilterMessage("publish session update").Len(); n != 1 {
		t.Fatalf("%d updates failed to publish and %d warnings were logged, want one", lost, n)
	}

	bus.Start()
	eventually(t, func() error {
		if !nc.IsConnected() {
			return errors.New("the bus connection is not back")
		}
		return nil
	})
	h.srv.publishChunk(ls, UpdateMessageChunk, "t-1", "after")
	again := logs.FilterMessage("session updates published again").All()
	if len(again) != 1 || again[0].ContextMap()["lost_updates"] != lost {
		t.Fatalf("after %d lost updates, published again: %v", lost, again)
	}
	t.Logf("%d updates lost while the bus was down, one warning and one line when they went out again", lost)
}
