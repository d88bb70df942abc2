package session

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A write cut by its deadline can still commit later: here the proxy in
// front of PostgreSQL holds back the UPDATE of a Close until after Close
// has given up, and the server runs it then. Status and State must
// report the close once it is in the database, never keep the answer
// read before it (they did, until the next write, before pg.Writes
// learned of writes whose outcome the client could not see).
func TestKeptReadsSeeAWriteThatCommitsLate(t *testing.T) {
	const delay = time.Second
	p := startHoldProxy(t, testenv.Postgres(t), []byte("update sessions set state"), delay)
	h := newHarnessOn(t, p.url)
	ctx := context.Background()
	id := h.newSession(alice, "")
	open := func() []string {
		t.Helper()
		st, err := h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: alice})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetSessionIds()
	}
	if got := open(); !slices.Equal(got, []string{id}) || h.state(alice, id) != stateIdle {
		t.Fatalf("before: %v, %s", got, h.state(alice, id))
	}

	p.arm.Store(true)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := h.srv.Close(short, &sessionv1.CloseRequest{Principal: alice, SessionId: id})
	cancel()
	p.arm.Store(false)
	if err == nil {
		t.Fatal("Close beat its deadline: the proxy held nothing back")
	}
	if p.held.Load() == 0 {
		t.Fatal("the proxy held nothing back")
	}
	// Read while the UPDATE is held: the database still says idle, and
	// that answer is what a kept read would go on giving.
	if got := open(); !slices.Equal(got, []string{id}) || h.state(alice, id) != stateIdle {
		t.Fatalf("while the UPDATE is held: %v, %s", got, h.state(alice, id))
	}
	eventually(t, func() error {
		var state string
		if err := h.pool.QueryRow(ctx, "SELECT state FROM sessions WHERE session_id = $1", id).Scan(&state); err != nil {
			return err
		}
		if state != stateClosed {
			return errors.New("the held UPDATE has not committed yet: " + state)
		}
		return nil
	})
	eventually(t, func() error {
		if got := open(); len(got) != 0 {
			return errors.New("status still lists the closed session")
		}
		if got := h.state(alice, id); got != stateClosed {
			return errors.New("state still says " + got)
		}
		return nil
	})
}

// holdProxy relays PostgreSQL connections through a socket of its own;
// while arm is set, on a connection whose client sends a message holding
// marker, the client's next message is held for delay (the statement is
// prepared, then its execution waits).
type holdProxy struct {
	url  string
	arm  atomic.Bool
	held atomic.Int32
}

func startHoldProxy(t *testing.T, dbURL string, marker []byte, delay time.Duration) *holdProxy {
	t.Helper()
	r := testenv.RelayPostgres(t, dbURL)
	p := &holdProxy{url: r.URL}
	// Registered before the harness's cleanup, so it runs after it.
	testenv.StartRelay(t, r.Path, r.Target, func() testenv.RelayHook {
		holdNext := false // the client's direction only
		return func(toTarget bool, chunk []byte) bool {
			if !toTarget {
				return true
			}
			if holdNext {
				holdNext = false
				p.held.Add(1)
				time.Sleep(delay)
			}
			if p.arm.Load() && bytes.Contains(bytes.ToLower(chunk), marker) {
				holdNext = true
			}
			return true
		}
	})
	return p
}
