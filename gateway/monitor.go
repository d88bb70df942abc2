package gateway

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/subjects"
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

	mu    sync.Mutex
	state map[string]*component
}

func newMonitor(interval time.Duration, log *zap.Logger) *monitor {
	return &monitor{interval: interval, log: log, state: map[string]*component{}}
}

func (m *monitor) add(name string, cc *grpc.ClientConn) {
	m.targets = append(m.targets, target{name: name, health: healthpb.NewHealthClient(cc)})
	m.state[name] = &component{Status: "unknown", UpdatedAt: time.Now().UTC()}
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
	resp, err := t.health.Check(ctx, &healthpb.HealthCheckRequest{})
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
		c.Status = "not_serving"
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

// components copies the whole records.
func (m *monitor) components() map[string]component {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]component, len(m.state))
	for name, c := range m.state {
		out[name] = *c
	}
	return out
}

// watchRestarts records the launcher's restart counts.
func (m *monitor) watchRestarts(nc *nats.Conn) (*nats.Subscription, error) {
	return nc.Subscribe(subjects.SupervisorRestarts, func(msg *nats.Msg) {
		var ev struct {
			Service      string `json:"service"`
			RestartCount int    `json:"restart_count"`
		}
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			m.log.Warn("bad restart notice", zap.Error(err))
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if c, ok := m.state[ev.Service]; ok {
			c.RestartCount = ev.RestartCount
		}
	})
}
