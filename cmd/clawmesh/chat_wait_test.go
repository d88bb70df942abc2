package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The client container of deploy/k8s/examples/client.yaml starts beside
// its gateway and may run first: chat failed at once ("start one with
// `clawmesh up`", which does not apply in a pod), exited 1 and restarted
// under a growing backoff. With --wait it waits for the socket and goes
// on once the gateway listens.
func TestChatWaitsForTheGateway(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "daemon.sock")
	t.Setenv("ZEROCLAW_SOCKET", sock)
	type result struct {
		stdout, stderr string
		code           int
	}
	done := make(chan result, 1)
	go func() {
		stdout, stderr, code := runCLI(t, "chat", "--wait", "5m")
		done <- result{stdout, stderr, code}
	}()
	time.Sleep(500 * time.Millisecond) // chat finds no socket first
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFake(conn, nil)
		}
	}()
	r := <-done
	if r.code != 0 || !strings.HasPrefix(r.stdout, "session sess_new ") {
		t.Fatalf("chat --wait: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
}

// A gateway that never listens ends the wait with what was waited for and
// the socket's source, not with `clawmesh up`.
func TestChatWaitGivesUp(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "daemon.sock")
	t.Setenv("ZEROCLAW_SOCKET", sock)
	_, stderr, code := runCLI(t, "chat", "--wait", "300ms")
	if code != 1 || !strings.Contains(stderr, "waited 300ms (--wait)") ||
		!strings.Contains(stderr, "no stack listens on "+sock+" (named by ZEROCLAW_SOCKET)") ||
		strings.Contains(stderr, "clawmesh up") {
		t.Fatalf("chat --wait with no gateway: exit %d, stderr %q", code, stderr)
	}
}

// A container that gives the socket alone (ZEROCLAW_SOCKET) and no $HOME
// reaches its gateway: chat resolved a data directory it does not use
// first and failed with "home directory: $HOME is not defined".
func TestNamedSocketNeedsNoHome(t *testing.T) {
	t.Setenv("ZEROCLAW_SOCKET", fakeStack(t))
	for _, env := range []string{"HOME", "ZEROCLAW_CONFIG_DIR", "ZEROCLAW_DATA_DIR"} {
		t.Setenv(env, "")
	}
	stdout, stderr, code := runCLI(t, "chat")
	if code != 0 || !strings.HasPrefix(stdout, "session sess_new ") {
		t.Fatalf("chat with ZEROCLAW_SOCKET and no $HOME: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}
