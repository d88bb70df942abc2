package session

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/hostclock"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Status and State say when they read, on the host's clock: after they
// were called and before they answered, whether they read the database
// or what they kept (the gateway answers from a read every status that
// arrived no later).
func TestReadsSayWhenTheyRead(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	check := func(what string, read func() (int64, error)) {
		t.Helper()
		before := hostclock.Early()
		at, err := read()
		after := hostclock.Early()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if at < before || at > after {
			t.Fatalf("%s read at %d, outside its call [%d, %d]", what, at, before, after)
		}
	}
	for range 2 { // the first from the database, the second from what was kept
		check("status", func() (int64, error) {
			st, err := h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: alice})
			return st.GetReadAt(), err
		})
		check("state", func() (int64, error) {
			st, err := h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: id})
			return st.GetReadAt(), err
		})
	}
}

// read_at is taken before the state is read: a Status whose read_at is
// no earlier than the moment a NewSession had returned counts that
// session, whether it was answered from the database or from what was
// kept. This is the promise the gateway answers callers by; here reads
// run beside a stream of writes, and every answer is checked against the
// writes that had returned by its read_at.
func TestReadAtPrecedesTheRead(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	type answer struct{ at, active int64 }
	var reads atomic.Int64
	stop := make(chan struct{})
	got := make(chan []answer, 1)
	go func() {
		var as []answer
		defer func() { got <- as }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, err := h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: operator})
			if err != nil {
				t.Error(err)
				return
			}
			as = append(as, answer{st.GetReadAt(), st.GetActiveSessions()})
			reads.Add(1)
		}
	}()
	const writes = 150
	returned := make([]int64, 0, writes) // when each NewSession had returned
	for range writes {
		h.newSession(alice, "default")
		returned = append(returned, hostclock.Late())
		afterReads(t, &reads, 2)
	}
	close(stop)
	as := testwait.Recv(t, got)
	for _, a := range as {
		n := int64(sort.Search(len(returned), func(i int) bool { return returned[i] > a.at }))
		if a.active < n {
			t.Fatalf("a status read at %d counts %d sessions; %d had been created by then", a.at, a.active, n)
		}
	}
}

// The same for State: one whose read_at is no earlier than the moment a
// Close of its session had returned sees the session closed.
func TestStateReadAtPrecedesTheRead(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	const n = 40
	ids := make([]string, n)
	for i := range ids {
		ids[i] = h.newSession(alice, "default")
	}
	closed := make([]atomic.Int64, n) // when each Close had returned; 0 before
	var reads atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for k := 0; ; k = (k + 1) % n {
			select {
			case <-stop:
				return
			default:
			}
			st, err := h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: ids[k]})
			if err != nil {
				t.Error(err)
				return
			}
			reads.Add(1)
			if c := closed[k].Load(); c != 0 && st.GetReadAt() >= c && st.GetState() != sessionv1.SessionState_SESSION_STATE_CLOSED {
				t.Errorf("session %d read at %d as %v; closed by %d", k, st.GetReadAt(), st.GetState(), c)
			}
		}
	}()
	for i, id := range ids {
		if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: alice, SessionId: id}); err != nil {
			t.Fatal(err)
		}
		closed[i].Store(hostclock.Late())
		afterReads(t, &reads, 2)
	}
	close(stop)
	testwait.Recv(t, done)
}

// afterReads waits until reads has risen by n, so that reads run between
// the writes.
func afterReads(t *testing.T, reads *atomic.Int64, n int64) {
	t.Helper()
	want := reads.Load() + n
	testenv.Eventually(t, 10*time.Second, 100*time.Microsecond, func() error {
		if got := reads.Load(); got < want {
			return fmt.Errorf("%d reads, waiting for %d", got, want)
		}
		return nil
	})
}
