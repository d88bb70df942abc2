package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// healthLine is what the test reads of one component of health.
type healthLine struct {
	Status       string  `json:"status"`
	LastError    *string `json:"last_error"`
	RestartCount int     `json:"restart_count"`
}

// healthOf calls health through call and decodes the components.
func healthOf(t *testing.T, call func(string, any) (json.RawMessage, error)) map[string]healthLine {
	t.Helper()
	raw, err := call("health", nil)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Components map[string]healthLine `json:"components"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatalf("health: %s: %v", raw, err)
	}
	return h.Components
}

// health answers from a record the monitor renews at each poll and
// restart notice, kept for requests to load without a lock or an
// allocation: the answer after a renewal must be the renewed record.
// A service that stops serving, the gateway's own reason to stop, and a
// restart notice are each seen by the next health answer after the poll
// (or the notice) that found them, and a service that serves again
// likewise.
func TestHealthAnswerFollowsEveryRenewal(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	var reason atomic.Value
	reason.Store("")
	g, socket := runGateway(t, awaySession{}, 5*time.Second, func(g *Gateway) {
		g.monitor.addSelf(func() string { return reason.Load().(string) })
		g.monitor.add("plugin-sandbox", serveFake(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, hs) }), nil)
		g.statusFixed = encodeStatusFixed("0.1.0", "/data", g.cfg.Socket)
		// New subscribes so; runGateway builds the gateway without it.
		sub, err := g.monitor.watchRestarts(g.nats)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	})
	c := dialInitialized(t, socket)
	defer c.Close()

	got := healthOf(t, c.Call)
	if got["plugin-sandbox"].Status != "serving" || got[SelfName].Status != "serving" {
		t.Fatalf("after the first poll: %+v", got)
	}

	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	reason.Store("bus link down")
	g.monitor.pollAll(context.Background()) // the poll the ticker makes
	got = healthOf(t, c.Call)
	if got["plugin-sandbox"].Status != "not_serving" || got[SelfName].Status != "not_serving" ||
		got[SelfName].LastError == nil || *got[SelfName].LastError != "bus link down" {
		t.Fatalf("the answer after a poll that found both not serving: %+v", got)
	}

	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	reason.Store("")
	g.monitor.pollAll(context.Background())
	got = healthOf(t, c.Call)
	if got["plugin-sandbox"].Status != "serving" || got[SelfName].Status != "serving" {
		t.Fatalf("the answer after a poll that found both serving again: %+v", got)
	}

	// A restart notice renews the record as it is recorded (no poll):
	// its delivery is the bus's, so wait for the answer that has it.
	if err := bus.PublishRestart(g.nats, "plugin-sandbox", 3); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := healthOf(t, c.Call)["plugin-sandbox"].RestartCount; n != 3 {
			return fmt.Errorf("restart_count %d, want 3", n)
		}
		return nil
	})
}

var healthSink any

// health's handler answers with the record the last renewal boxed: no
// allocation a request (it boxed the record in an interface each time,
// 24 bytes a request at every client's rate).
func TestHealthAnswerAllocatesNothing(t *testing.T) {
	g := &Gateway{monitor: newMonitor(time.Hour, zap.NewNop())}
	g.monitor.addSelf(func() string { return "" })
	if n := testing.AllocsPerRun(100, func() {
		r, err := g.health(context.Background(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		healthSink = r // the result escapes, as it does through a Handler
	}); n != 0 {
		t.Fatalf("health allocates %v objects a request, want 0", n)
	}
}
