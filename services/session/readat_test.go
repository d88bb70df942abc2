package session

import (
	"context"
	"testing"

	"github.com/clawmesh/clawmesh/internal/hostclock"
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
