package e2e_test

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// Every service's status line read "unknown" until the gateway's monitor
// had ended its first poll, which ran beside the listener and waited for
// every health check: the first status after `clawmesh up` or a gateway
// restart read running services as unknown, and for the whole of the
// poll's deadline when one process did not answer. Here plugin-sandbox
// is stopped (SIGSTOP: it answers nothing) and the gateway restarted:
// the first status says session and config serve, and plugin-sandbox
// unreachable.
func TestStatusAfterAGatewayRestartSaysEveryService(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "5m"}})
	sandbox := s.PIDOf("plugin-sandbox")
	if sandbox == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}
	hang(t, sandbox)
	gw := s.PIDOf("gateway")
	if gw == 0 {
		t.Fatalf("no gateway among %v", s.PIDs())
	}
	if err := syscall.Kill(gw, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The launcher keeps the client socket: this connection waits in its
	// backlog for the new gateway, and its status is that one's first.
	deadline := time.Now().Add(30 * time.Second)
	for s.PIDOf("gateway") == gw {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway %d still runs", gw)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c, err := e2e.Dial(s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Timeout = 30 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Call("status", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Services map[string]string `json:"services"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Services["session"] != "serving" || st.Services["config"] != "serving" || st.Services["plugin-sandbox"] != "unreachable" {
		t.Fatalf("the first status of a restarted gateway, plugin-sandbox stopped: %s", raw)
	}
}
