package e2e_test

import (
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// alive fails the test if the stack exits within d.
func alive(t *testing.T, s *e2e.Stack, d time.Duration, why string) {
	t.Helper()
	select {
	case <-s.Exited():
		t.Fatalf("stack exited %s:\n%s", why, s.Stderr())
	case <-time.After(d):
	}
}

func TestEphemeral(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--ephemeral"}})

	// Never before the first client has connected.
	alive(t, s, 2500*time.Millisecond, "before any client connected")

	a := s.Dial(t)
	b := s.Dial(t)
	if _, err := a.Initialize(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	alive(t, s, 1500*time.Millisecond, "while a client was still connected")

	// The last client leaves and another comes back within the grace.
	b.Close()
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	alive(t, s, 1500*time.Millisecond, "although a client reconnected within the grace")

	// The last client leaves for good: the whole stack stops by itself.
	c.Close()
	select {
	case <-s.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("ephemeral stack did not stop after the last client left")
	}
	if code := s.ExitCode(); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, s.Stderr())
	}
	if left := s.PIDs(); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
}

// Without --ephemeral the client count is ignored.
func TestNotEphemeralIgnoresClients(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	alive(t, s, 2500*time.Millisecond, "without --ephemeral after its client left")
}
