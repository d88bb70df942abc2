package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A principal could open sessions without end: each status lists the
// caller's open sessions (the operator's all of them) in one message of
// at most 16 MiB, so some 540,000 made the operator's status fail for
// good. MaxOpenSessions are open at most for one principal: past it
// session/new is refused SESSION_LIMIT_REACHED, made or reopened, also
// when the last ones race; others are not held back, and closing one
// makes room.
func TestOpenSessionsBoundedPerPrincipal(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var bobs []string
	for range MaxOpenSessions - 5 {
		bobs = append(bobs, h.newSession(bob, "default"))
	}
	// The last five, raced by twenty.
	errs := make([]error, 20)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: fmt.Sprintf("sess_race%02d", i), AgentAlias: "default"})
		}()
	}
	wg.Wait()
	made := 0
	for i, err := range errs {
		if err == nil {
			made++
			continue
		}
		wantRefusal(t, err, codes.ResourceExhausted, rpcerr.ReasonSessionLimit, "1000 sessions are open for this principal, the limit")
		if _, serr := os.Stat(filepath.Join(h.dataDir, "workspaces", fmt.Sprintf("sess_race%02d", i))); !os.IsNotExist(serr) {
			t.Fatalf("a refused session's workspace: %v", serr)
		}
	}
	if made != 5 {
		t.Fatalf("%d of the raced sessions made, want 5", made)
	}
	// Alice is not held back by bob's.
	h.newSession(alice, "default")
	// Closing one makes room; reopening it when full is refused.
	if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: bob, SessionId: bobs[0]}); err != nil {
		t.Fatal(err)
	}
	other := h.newSession(bob, "default")
	_, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: bobs[0], AgentAlias: "default"})
	wantRefusal(t, err, codes.ResourceExhausted, rpcerr.ReasonSessionLimit, "the limit; close or delete one first")
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: bob, SessionId: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: bobs[0], AgentAlias: "default"}); err != nil {
		t.Fatalf("reopened with room: %v", err)
	}
}

// A closed session keeps its rows and its workspace until it is deleted,
// and only open sessions were counted: a user making and closing sessions
// in a loop kept any number. A user keeps at most MaxKeptSessions, open or
// not: past it a new session is refused, a closed one may still be
// reopened, and deleting one makes room. The operator is not bounded.
func TestKeptSessionsBoundedPerUser(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	fill := func(owner, prefix string, n int) {
		t.Helper()
		if _, err := h.pool.Exec(ctx, `INSERT INTO sessions (session_id, agent_alias, owner, state, workspace_dir)
			SELECT $2 || i, 'default', $1, 'closed', '/nonexistent' FROM generate_series(1, $3) AS i`, owner, prefix, n); err != nil {
			t.Fatal(err)
		}
	}
	fill(bob.GetPrincipalId(), "sess_bobclosed", MaxKeptSessions-1)
	last := h.newSession(bob, "default")
	_, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, AgentAlias: "default"})
	wantRefusal(t, err, codes.ResourceExhausted, rpcerr.ReasonSessionLimit, "10000 sessions are kept for this principal, open or closed, the limit; delete one first")
	// Reopening a closed one adds nothing.
	if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: bob, SessionId: last}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: last, AgentAlias: "default"}); err != nil {
		t.Fatalf("reopen at the bound: %v", err)
	}
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: bob, SessionId: last}); err != nil {
		t.Fatal(err)
	}
	h.newSession(bob, "default")
	// The operator keeps what it keeps.
	fill(operator.GetPrincipalId(), "sess_opclosed", MaxKeptSessions)
	h.newSession(operator, "default")
}
