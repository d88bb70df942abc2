package launcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
)

// healthProbe asks a process's gRPC health service.
type healthProbe struct {
	cc *grpc.ClientConn
	hc healthpb.HealthClient
}

func newHealthProbe(addr string) (*healthProbe, error) {
	// A first run is handed its socket already listening (firstSocket):
	// the connection is made at once and waits in the backlog until the
	// process serves. A later run's socket appears 100 to 400 ms after
	// the process: retry the connection every few milliseconds (a failed
	// connect to a local socket costs microseconds). A delay let grow to
	// 250 ms put 60 to 170 ms between a service's "serving" and the
	// launcher's noticing it.
	cc, err := grpcclient.Dial(addr, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, Jitter: 0.2, MaxDelay: 20 * time.Millisecond},
		MinConnectTimeout: 2 * time.Second,
	}))
	if err != nil {
		return nil, err
	}
	return &healthProbe{cc: cc, hc: healthpb.NewHealthClient(cc)}, nil
}

func (h *healthProbe) probe(ctx context.Context) (bool, error) {
	var md metadata.MD
	resp, err := h.hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&md))
	if err != nil {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return false, fmt.Errorf("health check unanswered: %s", status.Convert(err).Message())
		}
		return true, fmt.Errorf("health check: %s", status.Convert(err).Message())
	}
	if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		return true, nil
	}
	reason := strings.Join(md.Get(grpcserver.ReasonTrailer), "; ")
	if reason == "" {
		reason = resp.GetStatus().String()
	}
	return true, errors.New("not serving: " + reason)
}

func (h *healthProbe) close() { h.cc.Close() }

// watch follows the process's health with the Watch stream, which the
// server answers at once and then at every change; the call waits for the
// connection (WaitForReady), so the first answer comes as soon as the
// process listens.
func (h *healthProbe) watch(ctx context.Context, changed func()) {
	for ctx.Err() == nil {
		stream, err := h.hc.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		for err == nil {
			if _, err = stream.Recv(); err == nil {
				changed()
			}
		}
		// The process went away or refused the stream: ask again shortly
		// (the tick probes meanwhile).
		select {
		case <-ctx.Done():
		case <-time.After(readyTick):
		}
	}
}

// postgresProbe asks the private cluster for a connection.
type postgresProbe struct{ c *pgcluster.Prepared }

func (p postgresProbe) probe(ctx context.Context) (bool, error) {
	answered, err := p.c.Probe(ctx)
	if err != nil && !answered {
		return false, fmt.Errorf("not accepting connections: %w", err)
	}
	return answered, err
}

func (postgresProbe) close() {}
