package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// component is the health record of one service process.
type component struct {
	Status       string     `json:"status"`
	UpdatedAt    time.Time  `json:"updated_at"`
	LastOK       *time.Time `json:"last_ok"`
	LastError    *string    `json:"last_error"`
	RestartCount int        `json:"restart_count"`
}

type target struct {
	name   string
	health healthpb.HealthClient
}

// monitor polls each service's gRPC health so status and health answer
// from a fresh record without a round of calls per request.
type monitor struct {
	targets  []target
	interval time.Duration
	log      *zap.Logger

	started  time.Time
	ramTotal int64

	mu    sync.Mutex
	state map[string]*component
	// encoded copies of state and of the process sample, renewed by each
	// poll, for health.
	stateJSON, procJSON json.RawMessage
}

func newMonitor(interval time.Duration, log *zap.Logger) *monitor {
	now := time.Now()
	total := memTotalBytes()
	m := &monitor{interval: interval, log: log, state: map[string]*component{}, started: now, ramTotal: total}
	m.procJSON, _ = json.Marshal(sampleProcess(now, total))
	m.stateJSON = json.RawMessage("{}")
	return m
}

// processJSON is the last sample of the gateway's own figures.
func (m *monitor) processJSON() json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.procJSON
}

// componentsJSON is the health record of every service, encoded.
func (m *monitor) componentsJSON() json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stateJSON
}

// encodeLocked renews stateJSON; m.mu is held.
func (m *monitor) encodeLocked() {
	if raw, err := json.Marshal(m.state); err == nil {
		m.stateJSON = raw
	}
}

func (m *monitor) add(name string, cc *grpc.ClientConn) {
	m.targets = append(m.targets, target{name: name, health: healthpb.NewHealthClient(cc)})
	m.state[name] = &component{Status: "unknown", UpdatedAt: time.Now().UTC()}
	m.encodeLocked()
}

// run polls until ctx is done.
func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.pollAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *monitor) pollAll(ctx context.Context) {
	p, _ := json.Marshal(sampleProcess(m.started, m.ramTotal))
	m.mu.Lock()
	m.procJSON = p
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.encodeLocked()
		m.mu.Unlock()
	}()
	var wg sync.WaitGroup
	for _, t := range m.targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.poll(ctx, t)
		}()
	}
	wg.Wait()
}

func (m *monitor) poll(ctx context.Context, t target) {
	ctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	var trailer metadata.MD
	resp, err := t.health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	now := time.Now().UTC()
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.state[t.name]
	c.UpdatedAt = now
	switch {
	case err != nil:
		c.Status = "unreachable"
		msg := status.Convert(err).Message()
		c.LastError = &msg
	case resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
		c.Status = "serving"
		c.LastOK = &now
	default:
		// The process says why: a dependency it needs is down (its
		// database, the bus), or it is shutting down.
		c.Status = "not_serving"
		reason := strings.Join(trailer.Get(grpcserver.ReasonTrailer), "; ")
		if reason == "" {
			reason = "not serving"
		}
		c.LastError = &reason
	}
}

// statuses maps each service to its last status word.
func (m *monitor) statuses() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.state))
	for name, c := range m.state {
		out[name] = c.Status
	}
	return out
}

// watchRestarts records the launcher's restart counts.
func (m *monitor) watchRestarts(nc *nats.Conn) (*nats.Subscription, error) {
	return bus.SubscribeRestarts(nc, func(ev *busv1.ProcessRestarted) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if c, ok := m.state[ev.GetProcess()]; ok {
			c.RestartCount = int(ev.GetRestartCount())
			m.encodeLocked()
		}
	}, func(err error) { m.log.Warn("bad restart notice", zap.Error(err)) })
}
