package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The bus server hangs (SIGSTOP) and a session/new comes before the
// gateway sees its link stale: it fails "gateway: bus unavailable", and
// once the server runs again the principal has no session it made.
// Before, the session stayed open, its id told to no client.
func TestBusStoppedSessionNewLeavesNoSession(t *testing.T) {
	t.Parallel()
	s, pid := stackOnBusChild(t)
	c := s.Dial(t)
	c.Timeout = 60 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return upServing(c) })
	sessions := func() int {
		t.Helper()
		raw, err := c.Call("session/list", map[string]any{"include_closed": true})
		if err != nil {
			t.Fatal(err)
		}
		var l struct {
			Sessions []json.RawMessage `json:"sessions"`
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatal(err)
		}
		return len(l.Sessions)
	}
	before := sessions()

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	_, err := newSession(c)
	var re *e2e.RPCError
	if !errors.As(err, &re) || re.Code != -32603 || re.Message != "gateway: bus unavailable" {
		t.Errorf("session/new in the stall: %v, want -32603 gateway: bus unavailable", err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, inHealth, _, err := gatewayWord(c)
		if err != nil {
			return err
		}
		if inHealth != "serving" {
			return fmt.Errorf("the gateway is %q with its bus server running again", inHealth)
		}
		return nil
	})
	if n := sessions(); n != before {
		t.Errorf("%d sessions after a session/new that failed, %d before", n, before)
	}
}
