package session

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Status and State answer from what they last read while nothing has been
// written since, and see every write that returned before they were
// called: a new session, a turn (which reorders the open sessions), a
// close, a reopen, a kill, a delete.
func TestKeptReadsFollowWrites(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	status := func() []string {
		t.Helper()
		st, err := h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: operator})
		if err != nil {
			t.Fatal(err)
		}
		if int(st.GetActiveSessions()) != len(st.GetSessionIds()) {
			t.Fatalf("status: %v", st)
		}
		return st.GetSessionIds()
	}
	queries := func() int64 { return h.srv.store.kept.queries.Load() }
	// noQuery runs read twice and checks that the second went to no
	// query: its answer was kept.
	noQuery := func(what string, read func()) {
		t.Helper()
		read()
		before := queries()
		read()
		if n := queries() - before; n != 0 {
			t.Fatalf("%s read again with nothing written: %d queries", what, n)
		}
	}
	if h.srv.store.kept.writes == nil {
		t.Fatal("the harness's pool counts no writes: nothing is kept")
	}

	a := h.newSession(alice, "")
	noQuery("status", func() { status() })
	b := h.newSession(bob, "")
	if got := status(); !slices.Equal(got, []string{b, a}) {
		t.Fatalf("after a second session/new: %v, want %v", got, []string{b, a})
	}
	// A turn of a moves it to the front (its messages are its activity).
	h.prompt(alice, a, "/say hi")
	if got := status(); !slices.Equal(got, []string{a, b}) {
		t.Fatalf("after a turn of %s: %v", a, got)
	}

	noQuery("state", func() { h.state(alice, a) })
	if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: alice, SessionId: a}); err != nil {
		t.Fatal(err)
	}
	if got := h.state(alice, a); got != stateClosed {
		t.Fatalf("after close: %s", got)
	}
	if got := status(); !slices.Equal(got, []string{b}) {
		t.Fatalf("after close: %v", got)
	}
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: a}); err != nil {
		t.Fatal(err)
	}
	if got := h.state(alice, a); got != stateIdle {
		t.Fatalf("after reopening: %s", got)
	}
	if got := status(); len(got) != 2 {
		t.Fatalf("after reopening: %v", got)
	}
	noQuery("state", func() { h.state(alice, a) })
	if _, err := h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: a}); err != nil {
		t.Fatal(err)
	}
	if got := h.state(alice, a); got != stateKilled {
		t.Fatalf("after kill: %s", got)
	}
	noQuery("state", func() { h.state(bob, b) })
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: bob, SessionId: b}); err != nil {
		t.Fatal(err)
	}
	_, err := h.srv.State(ctx, &sessionv1.StateRequest{Principal: bob, SessionId: b})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, b)
	if got := status(); len(got) != 0 {
		t.Fatalf("after kill and delete: %v", got)
	}
	// Another principal's session is refused from a kept row as from a
	// read one.
	c := h.newSession(bob, "")
	noQuery("state", func() { h.state(bob, c) })
	_, err = h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: c})
	wantRefusal(t, err, codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, c)
}

// While a write that failed on our side may still run on the server,
// Status and State read the database every time and keep nothing; once
// its backend is gone they keep again.
func TestKeptReadsWaitForUnsureWrites(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "")
	queries := func() int64 { return h.srv.store.kept.queries.Load() }
	reads := func() int64 {
		t.Helper()
		before := queries()
		if _, err := h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: alice}); err != nil {
			t.Fatal(err)
		}
		h.state(alice, id)
		return queries() - before
	}
	reads()
	if n := reads(); n != 0 {
		t.Fatalf("%d queries with everything kept", n)
	}

	// A backend of its own stands for the one a timed-out write of ours
	// ran on: unsure while it lives.
	busy, err := pgx.Connect(ctx, h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close(context.Background())
	pid := busy.PgConn().PID()
	h.srv.store.kept.writes.Failed(pid) // as a write of ours that timed out there
	for range 2 {
		if n := reads(); n != 2 {
			t.Fatalf("%d queries for a Status and a State with a write unsure, want 2", n)
		}
	}
	busy.Close(ctx)
	eventually(t, func() error {
		reads()
		if n := reads(); n != 0 {
			return fmt.Errorf("%d queries once the write is settled", n)
		}
		return nil
	})
}
