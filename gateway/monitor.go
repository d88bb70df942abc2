package gateway

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// stamp is a time in health's records: RFC 3339 in UTC to the
// millisecond. Services are polled every 500 ms; nanoseconds would only
// lengthen a reply clients poll.
type stamp time.Time

const stampLayout = "2006-01-02T15:04:05.000Z07:00"

// MarshalJSON writes the stamp as a JSON string.
func (t stamp) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(stampLayout)+2)
	b = append(b, '"')
	b = time.Time(t).UTC().AppendFormat(b, stampLayout)
	return append(b, '"'), nil
}

// component is the health record of one service process.
type component struct {
	Status       string  `json:"status"`
	UpdatedAt    stamp   `json:"updated_at"`
	LastOK       *stamp  `json:"last_ok"`
	LastError    *string `json:"last_error"`
	RestartCount int     `json:"restart_count"`
}

// SelfName is the gateway's own component in health and status. Its
// bus link is on no service's health: while it is down, every service may
// serve and yet no session/update reaches a client.
const SelfName = "gateway"

type target struct {
	name   string
	health healthpb.HealthClient
	asleep func() bool // nil: never dormant
}

// monitor polls each service's gRPC health so status and health answer
// from a fresh record without a round of calls per request.
type monitor struct {
	targets []target
	// self, when set, is the gateway's own reason for not serving (see
	// Config.Reason), reported as SelfName.
	self     func() string
	interval time.Duration
	log      *zap.Logger

	started  time.Time
	ramTotal int64

	mu    sync.Mutex
	state map[string]*component
	// procJSON is the last process sample, encoded.
	procJSON json.RawMessage
	// services maps each service to its status word, encoded (status).
	services json.RawMessage

	// answer is the whole health record as health's result (a
	// jsonrpc.EncodedJSON in an interface), renewed under mu with every
	// poll and restart notice, so that a client polling health costs no
	// encoding, no lock and no allocation: a request loads it. Every
	// renewal stores a new one, so the answer after a renewal is the
	// renewed record.
	answer atomic.Value
}

func newMonitor(interval time.Duration, log *zap.Logger) *monitor {
	now := time.Now()
	total := memTotalBytes()
	m := &monitor{interval: interval, log: log, state: map[string]*component{}, started: now, ramTotal: total}
	m.procJSON, _ = json.Marshal(sampleProcess(now, total))
	m.encodeLocked()
	return m
}

// healthAnswer is docs/spec.md §5's health record as of the last poll
// or restart notice, as a jsonrpc.EncodedJSON result.
func (m *monitor) healthAnswer() any { return m.answer.Load() }

// encodeLocked renews record; m.mu is held. The record's updated_at
// and uptime_seconds are those of this moment, when its figures were
// taken, not of the request that reads it: a record at most one poll
// interval old says so.
func (m *monitor) encodeLocked() {
	components, err := json.Marshal(m.state)
	if err != nil {
		return
	}
	words := make(map[string]string, len(m.state))
	for name, c := range m.state {
		words[name] = c.Status
	}
	if m.services, err = json.Marshal(words); err != nil {
		return
	}
	now := time.Now().UTC()
	b := make([]byte, 0, 256+len(components)+len(m.procJSON))
	b = append(b, `{"pid":`...)
	b = strconv.AppendInt(b, int64(os.Getpid()), 10)
	b = append(b, `,"updated_at":"`...)
	b = now.AppendFormat(b, stampLayout)
	b = append(b, `","uptime_seconds":`...)
	b = strconv.AppendInt(b, int64(now.Sub(m.started).Seconds()), 10)
	b = append(b, `,"components":`...)
	b = append(b, components...)
	b = append(b, `,"process":`...)
	b = append(b, m.procJSON...)
	b = append(b, '}')
	// Boxed here, once a renewal, where a request would box it once
	// per answer (a 24-byte allocation on health's path).
	m.answer.Store(jsonrpc.EncodedJSON(b))
}

// add monitors a service; asleep, when not nil, reports that the
// service is dormant (not started until a client of its own connects).
func (m *monitor) add(name string, cc *grpc.ClientConn, asleep func() bool) {
	m.targets = append(m.targets, target{name: name, health: healthpb.NewHealthClient(cc), asleep: asleep})
	m.state[name] = &component{Status: "unknown", UpdatedAt: stamp(time.Now())}
	m.encodeLocked()
}

// addSelf reports the gateway itself as SelfName, from reason (see
// Config.Reason).
func (m *monitor) addSelf(reason func() string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.self = reason
	m.state[SelfName] = &component{Status: "unknown", UpdatedAt: stamp(time.Now())}
	m.encodeLocked()
}

// run polls every interval until ctx is done; Run made the first poll
// (first).
func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.pollAll(ctx)
	}
}

// first makes the first poll; Run calls it before it serves. Made beside
// the listener, it encoded its findings only once every health check had
// answered, and until then status and health said "unknown" for every
// process, the gateway's own line included: `clawmesh status` right after
// `clawmesh up`, or a client's first call after a gateway restart, read
// services that served as unknown, for the whole of the poll's deadline
// when one process did not answer. A client's first call now waits for
// it in the socket's backlog: a few milliseconds, pollWait at most.
func (m *monitor) first(ctx context.Context) { m.pollAll(ctx) }

// pollWait is how long one health check may take: the poll interval, at
// most maxPollWait (an interval made longer, as tests do, would leave the
// first poll, and the listener behind it, waiting on a process that does
// not answer).
func (m *monitor) pollWait() time.Duration { return min(m.interval, maxPollWait) }

const maxPollWait = time.Second

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
	m.pollSelf()
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
	if t.asleep != nil && t.asleep() {
		// Not started: no call to make (a gRPC dial to a missing
		// socket every poll would cost for nothing).
		m.mu.Lock()
		defer m.mu.Unlock()
		c := m.state[t.name]
		c.UpdatedAt = stamp(time.Now().UTC())
		c.Status, c.LastError = "dormant", nil
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.pollWait())
	defer cancel()
	var trailer metadata.MD
	resp, err := t.health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	now := time.Now().UTC()
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.state[t.name]
	c.UpdatedAt = stamp(now)
	switch {
	case err != nil && t.asleep != nil && t.asleep():
		// Not started (or its socket went between the check above and
		// the call): nothing is wrong with it.
		c.Status = "dormant"
		c.LastError = nil
	case err != nil:
		c.Status = "unreachable"
		msg := status.Convert(err).Message()
		c.LastError = &msg
	case resp.GetStatus() == healthpb.HealthCheckResponse_SERVING:
		c.Status = "serving"
		ok := stamp(now)
		c.LastOK = &ok
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

// pollSelf records the gateway's own state as its services' are
// recorded: not_serving with the reason (last_error kept once it serves
// again), or serving.
func (m *monitor) pollSelf() {
	if m.self == nil {
		return
	}
	reason := m.self()
	now := time.Now().UTC()
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.state[SelfName]
	c.UpdatedAt = stamp(now)
	if reason != "" {
		c.Status = "not_serving"
		c.LastError = &reason
		return
	}
	c.Status = "serving"
	ok := stamp(now)
	c.LastOK = &ok
}

// statusOf is name's last status word ("" for no such service).
func (m *monitor) statusOf(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.state[name]; ok {
		return c.Status
	}
	return ""
}

// servicesJSON maps each service to its last status word, encoded.
func (m *monitor) servicesJSON() json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.services
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
