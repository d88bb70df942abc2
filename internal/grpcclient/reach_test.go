package grpcclient

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// With every sandbox replica gone for good (its socket missing, no
// process restarting it) a call through DialReplicas with a deadline
// waited out the whole deadline for a replica that serves: a tool
// call's two minutes, an hour here, so the test's bound ran out first.
// It now fails once no address has connected for RestartGrace,
// Unavailable and naming a dependency, the call and the stream waiting
// alike. One address fared otherwise before (dialled as by Dial: a
// call failed at once with gRPC's connect error); it is now a set of
// one, and fails the same way.
func TestCallsFailOnceNoReplicaIsReachable(t *testing.T) {
	dir := t.TempDir()
	gone := filepath.Join(dir, "gone.sock")
	for name, addr := range map[string]string{
		"one address":   gone,
		"two addresses": gone + "," + filepath.Join(dir, "gone.1.sock"),
	} {
		t.Run(name, func(t *testing.T) {
			cc, err := DialReplicas(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			client := healthpb.NewHealthClient(cc)
			calls := map[string]func() error{
				"call": func() error {
					_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
					return err
				},
				"stream": func() error {
					_, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
					return err
				},
			}
			for kind, call := range calls {
				done := make(chan error, 1)
				go func() { done <- call() }()
				select {
				case err := <-done:
					st := status.Convert(err)
					reason, _ := rpcerr.Details(st)
					if st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), NoReplicaReachable) || reason != rpcerr.ReasonDependency {
						t.Fatalf("a %s with every replica gone: %v (reason %q)", kind, err, reason)
					}
					t.Logf("%s: %v", kind, err)
				case <-time.After(RestartGrace + 30*time.Second):
					t.Fatalf("a %s with an hour's deadline and every replica gone still waits after %v", kind, RestartGrace+30*time.Second)
				}
			}
		})
	}
}
