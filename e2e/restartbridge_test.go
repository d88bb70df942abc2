package e2e_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// restartBridge kills the durable bridge and waits for its next start to
// be ready; it returns the old epoch.
func restartBridge(t *testing.T, s *e2e.Stack, c *collietest.Client) string {
	t.Helper()
	epoch := c.Hello.Epoch
	bridge := s.PIDOf("durable-bridge")
	if bridge == 0 {
		t.Fatal("no durable-bridge pid")
	}
	if err := syscall.Kill(bridge, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() error {
		h, err := c.SayHello(context.Background())
		switch {
		case err != nil:
			return err
		case h.Epoch == epoch:
			return errors.New("still the old epoch")
		case !h.Ready:
			return errors.New("not ready")
		}
		return nil
	})
	return epoch
}
