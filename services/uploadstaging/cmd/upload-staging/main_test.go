package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/service/servicetest"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	uploadv1 "github.com/clawmesh/clawmesh/proto/clawmesh/upload/v1"
)

// liveConfig answers Live with the schema's defaults (an empty document).
type liveConfig struct {
	configv1.UnimplementedConfigServiceServer
}

func (liveConfig) Live(context.Context, *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	doc, err := structpb.NewStruct(map[string]any{})
	return &configv1.LiveResponse{Revision: 1, Document: doc}, err
}

// upload-staging started (a restart after a crash or a kill) while the
// config service was hung (SIGSTOPped: connections wait in its
// backlog): it waited a minute for config's Live and exited, the
// launcher started it again, and it did the same for as long as config
// was hung; its health said "starting: setting up its services". It now
// waits for config however long it takes, health NOT_SERVING saying so
// and every call Unavailable naming config (nothing is served without
// config's settings and authorization), and serves once config answers,
// the same process.
func TestStartWaitsForAHungConfig(t *testing.T) {
	st := servicetest.StartWithHungConfig(t, "upload-staging", spec())
	cc := st.Conn
	health := func() (healthpb.HealthCheckResponse_ServingStatus, string, error) { return st.Health(t) }
	const waiting = "starting: waiting for the config service"
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		st, reason, err := health()
		if err != nil {
			return err
		}
		if st != healthpb.HealthCheckResponse_NOT_SERVING || reason != waiting {
			return fmt.Errorf("health with config hung: %v %q, want NOT_SERVING %q", st, reason, waiting)
		}
		return nil
	})
	// A call is refused, naming what is missing: nothing is accepted
	// without config.
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := uploadv1.NewUploadServiceClient(cc).DiscardConnection(cctx, &uploadv1.DiscardConnectionRequest{ConnectionId: "c", GatewayId: "g"})
	ccancel()
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != waiting {
		t.Fatalf("a call with config hung: %v, want Unavailable %q", err, waiting)
	}

	// Config runs again: the connections waiting in its backlog are
	// served, and the same process serves.
	srv := grpc.NewServer()
	configv1.RegisterConfigServiceServer(srv, liveConfig{})
	go srv.Serve(st.Hung) //nolint:errcheck // ends with Stop
	defer srv.Stop()
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() error {
		st, reason, err := health()
		if err != nil {
			return err
		}
		if st != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health with config back: %v %q", st, reason)
		}
		return nil
	})
	st.Stop()
	if err := <-st.Done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("stop: %v", err)
	}
}
