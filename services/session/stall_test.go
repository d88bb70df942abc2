package session

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A prompt's call has no deadline, and admit read and wrote the database
// holding the session's lock: with its row locked by another transaction
// (a stalled database does the same), ConnectionClosed for an unrelated
// connection, Cancel and Close, each with a deadline of a second, were
// still waiting after five. admit's database work is bounded now: the
// prompt fails as unavailable, and the others are served.
func TestPromptStallReleasesTheSession(t *testing.T) {
	defer func(d time.Duration) { admitTimeout = d }(admitTimeout)
	admitTimeout = 2 * time.Second // long enough to see admit hold the lock, short of the checks' five
	h := newHarness(t)
	id := h.newSession(operator, "")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM session.sessions WHERE session_id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say hi", ConnectionId: "conn-a"})
	eventually(t, func() error { // admit holds the session's lock
		ls := h.srv.lookupLive(id)
		if ls == nil || ls.mu.TryLock() {
			if ls != nil {
				ls.mu.Unlock()
			}
			return context.DeadlineExceeded
		}
		return nil
	})
	within := func(name string, call func(ctx context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- call(cctx) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s with a deadline of a second still waiting after five", name)
		}
	}
	within("ConnectionClosed", func(ctx context.Context) error {
		_, err := h.srv.ConnectionClosed(ctx, &sessionv1.ConnectionClosedRequest{ConnectionId: "conn-b"})
		return err
	})
	within("Cancel", func(ctx context.Context) error {
		_, err := h.srv.Cancel(ctx, &sessionv1.CancelRequest{Principal: operator, SessionId: id})
		return err
	})
	if r := <-res; status.Code(r.err) != codes.Unavailable {
		t.Fatalf("the prompt whose admission stalled: %v", r.err)
	}
	// The stall over, the session takes a turn.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: "/say hi", ConnectionId: "conn-a"}); r.err != nil {
		t.Fatalf("after the stall: %v", r.err)
	}
}
