package main

import (
	"bufio"
	"encoding/json"
	"net"
	"strings"
	"testing"
)

// statusStack serves initialize and answers status with result.
func statusStack(t *testing.T, result map[string]any) string {
	return statusStackInit(t, map[string]any{"protocol_version": 1}, result)
}

// statusStackInit answers initialize with init and status with result.
func statusStackInit(t *testing.T, init, result map[string]any) string {
	return fakeSocket(t, func(conn net.Conn) {
		defer conn.Close()
		lines := bufio.NewScanner(conn)
		for lines.Scan() {
			var req struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(lines.Bytes(), &req) != nil {
				return
			}
			var res any = init
			if req.Method == "status" {
				res = result
			}
			raw, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": res})
			if _, err := conn.Write(append(raw, '\n')); err != nil {
				return
			}
		}
	})
}

// `clawmesh status` was an unknown command (exit 2): the status method
// was reachable only as JSON through clawmesh call. It prints the
// status readably and exits 0 when every service serves (or is
// dormant), 1 naming the others.
func TestStatusCommand(t *testing.T) {
	serving := map[string]any{
		"server_version": "0.1.0", "protocol_version": 1, "active_sessions": 2,
		"session_ids": []string{"sess_a", "sess_b"}, "config_dir": "/data", "local_ipc_endpoint": "/data/daemon.sock",
		"services": map[string]string{"config": "serving", "session": "serving", "upload-staging": "dormant", "gateway": "serving"},
	}
	stdout, stderr, code := runCLI(t, "status", "--socket", statusStack(t, serving))
	if code != 0 {
		t.Fatalf("clawmesh status: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	for _, want := range []string{"0.1.0 (protocol 1)", "/data/daemon.sock", "2 open: sess_a, sess_b", "  config          serving", "  upload-staging  dormant"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("clawmesh status printed no %q:\n%s", want, stdout)
		}
	}

	away := map[string]any{
		"server_version": "0.1.0", "protocol_version": 1, "active_sessions": 0, "session_ids": []string{},
		"config_dir": "/data", "local_ipc_endpoint": "/data/daemon.sock", "sessions_unavailable": "session timed out",
		"services": map[string]string{"config": "unreachable", "session": "serving", "gateway": "serving"},
	}
	stdout, stderr, code = runCLI(t, "status", "--socket", statusStack(t, away))
	if code != 1 || !strings.Contains(stdout, "unknown (session timed out)") || !strings.Contains(stdout, "config   unreachable") ||
		!strings.Contains(stderr, "not every service is serving: config unreachable") {
		t.Fatalf("clawmesh status with config away: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}

// With config away, the gateway binds the operator by its uid alone and
// says so in initialize's config_unavailable; clawmesh status printed
// nothing of it, so the operator could not tell that the stack, while
// config is away, serves no one else (every other peer's initialize
// fails). It says so now, on its own line.
func TestStatusSaysBoundWithoutConfig(t *testing.T) {
	away := map[string]any{
		"server_version": "0.1.0", "protocol_version": 1, "active_sessions": 0, "session_ids": []string{},
		"config_dir": "/data", "local_ipc_endpoint": "/data/daemon.sock",
		"services": map[string]string{"config": "unreachable", "session": "serving", "gateway": "serving"},
	}
	init := map[string]any{"protocol_version": 1, "principal_id": "shared-operator", "config_unavailable": "config timed out"}
	stdout, stderr, code := runCLI(t, "status", "--socket", statusStackInit(t, init, away))
	want := "caller    the operator, bound without the config service (config timed out): until it answers, no other caller can initialize"
	if code != 1 || !strings.Contains(stdout, want) {
		t.Fatalf("clawmesh status bound without config: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	// Bound by config: no such line.
	stdout, _, _ = runCLI(t, "status", "--socket", statusStack(t, away))
	if strings.Contains(stdout, "bound without") {
		t.Fatalf("clawmesh status bound by config:\n%s", stdout)
	}
}
