package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clawmesh/clawmesh/internal/service/servicetest"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A replica started while the config service was hung gave it 15 s and
// exited, to be started again and do the same for as long as config was
// hung. It now waits, health saying why (no plugin is loaded on settings
// config did not give), and a stop ends the wait.
func TestStartWaitsForAHungConfig(t *testing.T) {
	st := servicetest.StartWithHungConfig(t, "plugin-sandbox", spec())
	const waiting = "starting: waiting for the config service"
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		status, reason, err := st.Health(t)
		if err != nil {
			return err
		}
		if status != healthpb.HealthCheckResponse_NOT_SERVING || reason != waiting {
			return fmt.Errorf("health with config hung: %v %q, want NOT_SERVING %q", status, reason, waiting)
		}
		return nil
	})
	// Alive meanwhile: a pod's startup probe asks the liveness name, and
	// restarted the replica every 120 s while config hung.
	if !st.Alive(t) {
		t.Fatal("liveness NOT_SERVING while the start waits for config")
	}
	st.Stop()
	if err := <-st.Done; err == nil || !strings.Contains(err.Error(), "stopped while waiting for it") {
		t.Fatalf("a stop while waiting for config: %v", err)
	}
}
