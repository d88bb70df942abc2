package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// serviceState is a service's word in status and its component in
// health.
func serviceState(t *testing.T, c *e2e.Client, name string) (inStatus, inHealth string, lastError *string) {
	t.Helper()
	st, err := status(c)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.Call("health", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Components map[string]struct {
			Status    string  `json:"status"`
			LastError *string `json:"last_error"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	return st.Services[name], h.Components[name].Status, h.Components[name].LastError
}

func waitState(t *testing.T, c *e2e.Client, name, want string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		if got, _, _ := serviceState(t, c, name); got != want {
			return fmt.Errorf("%s is %q, want %q", name, got, want)
		}
		return nil
	})
}

// A stack no Collie has used does not run its durable bridge: the
// launcher holds the bridge's socket, status and health say "dormant"
// (no error), and doctor is content. The first Collie connection wakes
// it and is served; the bridge's later runs get the same socket (a
// client of a restarting bridge waits rather than being refused); and
// from then on the data directory's stacks start it with the others.
func TestDurableBridgeSleepsUntilCollieConnects(t *testing.T) {
	t.Parallel()
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, "durable-bridge", "dormant")
	if _, inHealth, lastErr := serviceState(t, c, "durable-bridge"); inHealth != "dormant" || lastErr != nil {
		t.Fatalf("health: %q, last_error %v; want dormant with no error", inHealth, lastErr)
	}
	if pid := s.PIDOf("durable-bridge"); pid != 0 {
		t.Fatalf("durable bridge running (pid %d) with no client of its own", pid)
	}
	if fi, err := os.Stat(filepath.Join(dir, "durable.sock")); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the dormant bridge's socket is not held: %v", err)
	}
	if out, err := cli(t, s, "doctor"); err != nil {
		t.Fatalf("doctor with the bridge dormant: %v\n%s", err, out)
	}

	// The first connection wakes it and is answered.
	ph := phone(t, s)
	first := s.PIDOf("durable-bridge")
	if first == 0 {
		t.Fatal("a Collie was served with no durable bridge running")
	}
	waitState(t, c, "durable-bridge", "serving")
	if _, err := os.Stat(filepath.Join(dir, "durable-bridge.woken")); err != nil {
		t.Fatalf("the data directory is not marked: %v", err)
	}

	// A restart of the bridge keeps the socket: a hello sent while no
	// bridge runs waits in the backlog and is answered by the new run,
	// the first time (a refused connection would fail it).
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if pid := s.PIDOf("durable-bridge"); pid == first {
			return fmt.Errorf("bridge pid %d still alive", pid)
		}
		return nil
	})
	if _, err := ph.SayHello(context.Background()); err != nil {
		t.Fatalf("hello across the bridge's restart: %v", err)
	}
	if pid := s.PIDOf("durable-bridge"); pid == 0 || pid == first {
		t.Fatalf("bridge pid %d after the hello (killed %d)", pid, first)
	}

	// The next stack on this data directory starts it with the others.
	s.Stop()
	if _, err := os.Stat(filepath.Join(dir, "durable.sock")); !os.IsNotExist(err) {
		t.Fatalf("durable.sock left after the stack stopped: %v", err)
	}
	s2 := e2e.Start(t, e2e.Options{DataDir: dir})
	if s2.PIDOf("durable-bridge") == 0 {
		t.Fatal("a bridge that has run before did not start with the stack")
	}
	c2 := s2.Dial(t)
	if _, err := c2.Initialize(); err != nil {
		t.Fatal(err)
	}
	waitState(t, c2, "durable-bridge", "serving")
}

// Settings only the bridge can act on (a socket elsewhere, the token
// transport) wake it with the stack, without the held socket.
func TestDurableBridgeWokenBySettings(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", "durable.listen_url=http://127.0.0.1:0"}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, "durable-bridge", "serving")
	phone(t, s)
}

// Woken by a Collie while the config service hung (SIGSTOP), the bridge
// waited for config with the handed socket unanswered: Collie's hello
// sat in the backlog until its own timeout, the agent shown unreachable
// with no reason. The bridge now answers there while its start waits:
// hello with ready false, every other route 503 starting naming config;
// once config is back it serves on the same socket.
func TestDurableBridgeWokenWhileConfigIsHung(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "10m"}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, "durable-bridge", "dormant")
	resume := hang(t, s.PIDOf("config"))

	ph := collietest.Socket(filepath.Join(s.DataDir, "durable.sock"))
	ph.Timeouts = durableTimeouts
	t.Cleanup(ph.Close)
	h, err := ph.SayHello(context.Background())
	if err != nil {
		t.Fatalf("hello waking the bridge with config hung: %v", err)
	}
	if h.Ready {
		t.Fatal("hello says ready while the bridge waits for config")
	}
	// Its start first opens its database and connects to the bus, saying
	// so, then waits for config.
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		r, err := ph.Do(context.Background(), http.MethodGet, "/snapshot", nil, nil, durableTimeouts.Read, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusServiceUnavailable || r.Code() != "starting" {
			t.Fatalf("snapshot while the bridge waits for config: %v", r)
		}
		if !strings.Contains(string(r.Body), "config service") {
			return fmt.Errorf("snapshot: %v", r)
		}
		return nil
	})
	// Woken, it is no longer shown dormant (as it was for as long as
	// the launcher waited for it to be ready) but as it is: starting,
	// waiting for config.
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		inStatus, inHealth, lastErr := serviceState(t, c, "durable-bridge")
		if inStatus != "not_serving" || inHealth != "not_serving" || lastErr == nil ||
			!strings.Contains(*lastErr, "waiting for the config service") {
			return fmt.Errorf("woken bridge: status %q, health %q, last_error %s", inStatus, inHealth, shownErr(lastErr))
		}
		return nil
	})

	resume()
	waitReady(t, ph)
	if _, _, err := ph.Poll(context.Background()); err != nil {
		t.Fatalf("snapshot once config is back: %v", err)
	}
}

func shownErr(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}

// Woken by a Collie while PostgreSQL hung (SIGSTOP, postmaster and
// backends), the bridge's start waited for its database (up to a
// minute) before it took the handed socket: Collie's hello sat in the
// backlog until its own timeout, the agent shown unreachable with no
// reason. The socket now answers from before the database step: hello
// with ready false, every other route 503 starting naming the
// database; once PostgreSQL runs again the bridge serves there.
func TestDurableBridgeWokenWhileDatabaseIsHung(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{PrivateCluster: true, Args: []string{"--liveness-timeout", "10m"}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	waitState(t, c, "durable-bridge", "dormant")
	resume := hangPostgres(t, s)

	ph := collietest.Socket(filepath.Join(s.DataDir, "durable.sock"))
	ph.Timeouts = durableTimeouts
	t.Cleanup(ph.Close)
	h, err := ph.SayHello(context.Background())
	if err != nil {
		t.Fatalf("hello waking the bridge with PostgreSQL hung: %v", err)
	}
	if h.Ready {
		t.Fatal("hello says ready while the bridge waits for its database")
	}
	r, err := ph.Do(context.Background(), http.MethodGet, "/snapshot", nil, nil, durableTimeouts.Read, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusServiceUnavailable || r.Code() != "starting" || !strings.Contains(string(r.Body), "waiting for the database") {
		t.Fatalf("snapshot while the bridge waits for its database: %v", r)
	}

	resume()
	waitReady(t, ph)
	if _, _, err := ph.Poll(context.Background()); err != nil {
		t.Fatalf("snapshot once PostgreSQL is back: %v", err)
	}
}
