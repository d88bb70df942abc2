package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// hungHealth never answers a health check until its caller gives up.
type hungHealth struct {
	healthpb.UnimplementedHealthServer
	asked chan struct{}
}

func (h *hungHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	select {
	case h.asked <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// The gateway's own line was "unknown" in status and health until its
// monitor's first poll had ended, which runs beside the listener and
// waits for every service's health check: a client whose first call came
// before (a CI run's, 0.02 s in; 1 in 6 and 1 in 8 first calls after a
// gateway restart on a real stack) read its own gateway as unknown. Here
// a service does not answer its health check (the poll interval an hour:
// the first poll, which Run now makes before it serves, gives it up
// after maxPollWait), and the gateway says what it knows of itself from
// the first answer.
func TestStatusSaysTheGatewayFromTheFirstAnswer(t *testing.T) {
	hung := &hungHealth{asked: make(chan struct{}, 1)}
	_, socket := runGateway(t, awaySession{}, 5*time.Second, func(g *Gateway) {
		g.monitor.addSelf(func() string { return "" })
		g.monitor.add("plugin-sandbox", serveFake(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, hung) }), nil)
		g.statusFixed = encodeStatusFixed("0.1.0", "/data", g.cfg.Socket)
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	<-hung.asked // the first poll is under way, and stays so
	raw, err := c.Call("status", nil)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Services map[string]string `json:"services"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Services[SelfName] != "serving" {
		t.Fatalf("status before the monitor's first poll ended: %s", raw)
	}
	raw, err = c.Call("health", nil)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Components map[string]struct {
			Status string `json:"status"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	if h.Components[SelfName].Status != "serving" {
		t.Fatalf("health before the monitor's first poll ended: %s", raw)
	}
}
