package durablebridge

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A socket handed over while the start waits (for config): it answers
// as an agent not ready yet, in the wire's order of refusals, saying
// what it waits for; Stop hands the connections over to the bridge,
// which serves them, a client's kept-alive one included.
func TestEarlyAnswersUntilTheBridgeServes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "private", "durable.sock")
	ln, err := durablesock.ListenSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	early, final := AnswerEarly(ln, "test host", "waiting for the config service", testenv.Logger(t))
	t.Cleanup(early.Stop)
	c := collietest.Socket(path)
	t.Cleanup(c.Close)

	h, err := c.SayHello(context.Background())
	if err != nil {
		t.Fatalf("hello while starting: %v", err)
	}
	if h.Ready || len(h.Epoch) != 32 || h.Host.Name != "test host" {
		t.Fatalf("hello while starting: %+v", h)
	}
	r := raw(t, c, http.MethodGet, "/snapshot", v1(), nil)
	want(t, r, http.StatusServiceUnavailable, codeStarting)
	var e wireError
	if err := r.JSON(&e); err != nil || e.Message != "the durable agent is starting: waiting for the config service" {
		t.Fatalf("snapshot while starting: %s (%v)", r, err)
	}
	fresh := collietest.Socket(path) // no hello: no version header
	t.Cleanup(fresh.Close)
	want(t, raw(t, fresh, http.MethodGet, "/snapshot", nil, nil), http.StatusBadRequest, codeVersionRequired)
	want(t, raw(t, c, http.MethodGet, "/nothing", v1(), nil), http.StatusNotFound, codeNotFound)
	early.SetWaitingOn("")
	r = raw(t, c, http.MethodGet, "/snapshot", v1(), nil)
	if err := r.JSON(&e); err != nil || e.Message != "the durable agent is starting" {
		t.Fatalf("snapshot once config answered: %s (%v)", r, err)
	}

	early.Stop()
	// A hello sent now waits for the bridge, and is served by it.
	pending := collietest.Socket(path)
	pending.Timeouts.Read = 30 * time.Second
	t.Cleanup(pending.Close)
	got := make(chan error, 1)
	go func() {
		h, err := pending.SayHello(context.Background())
		if err == nil && h.Epoch != testEpoch {
			err = context.Canceled
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond) // let it connect before the bridge serves
	w := &wireBridge{b: &Bridge{
		cfg:    Config{Log: testenv.Logger(t), HostName: "test host", RefuseDescendants: func() bool { return false }},
		log:    testenv.Logger(t),
		layout: NewLayout(testEpoch),
		base:   context.Background(),
	}, socket: path}
	w.b.layout.SetReady()
	w.serve(t, boundConns(final, socketConns), overSocket, "")
	if err := <-got; err != nil {
		t.Fatalf("a hello sent between the two: %v", err)
	}
	h, err = c.SayHello(context.Background())
	if err != nil || !h.Ready || h.Epoch != testEpoch {
		t.Fatalf("hello once the bridge serves: %+v, %v", h, err)
	}
	want(t, raw(t, c, http.MethodGet, "/snapshot", v1(), nil), http.StatusOK, "")
}
