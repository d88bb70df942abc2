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

// A channel's senders are outside the machine, and each thread they
// write on is a session of the operator's: counted with the operator's
// own, 1000 threads took all of them, and the operator's session/new was
// refused (each alias closes its idle conversations past max_sessions,
// but aliases and replicas add up). The operator's channel
// conversations have a bound of their own; its own sessions are not
// held back by them, nor the other way round; a user naming its
// sessions' surface "channel:" gets no second allowance.
func TestChannelConversationsLeaveTheOperatorsOwnRoom(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	// The conversations written straight into the table: a thousand
	// session/new calls would take the test's time, not its point.
	if _, err := h.pool.Exec(ctx, `INSERT INTO sessions (session_id, agent_alias, owner, state, interaction_surface, workspace_dir, cwd)
		SELECT 'chan_' || i, 'default', $1, 'idle', 'channel:hook', '', '' FROM generate_series(1, $2) AS i`,
		operator.GetPrincipalId(), MaxOpenChannelSessions); err != nil {
		t.Fatal(err)
	}
	_, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: operator, SessionId: "chan_more", AgentAlias: "default", InteractionSurface: "channel:hook"})
	wantRefusal(t, err, codes.ResourceExhausted, rpcerr.ReasonSessionLimit, "1000 channel conversations are open, the limit")
	// The operator's own sessions are not held back.
	own := h.newSession(operator, "default")
	// Nor is a closed conversation's reopening once one closes.
	if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: operator, SessionId: "chan_1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: operator, SessionId: "chan_more", AgentAlias: "default", InteractionSurface: "channel:hook"}); err != nil {
		t.Fatalf("a conversation with room: %v", err)
	}
	_, err = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: operator, SessionId: "chan_1", AgentAlias: "default", InteractionSurface: "channel:hook"})
	wantRefusal(t, err, codes.ResourceExhausted, rpcerr.ReasonSessionLimit, "channel conversations are open, the limit")
	if own == "" {
		t.Fatal("no session of the operator's own")
	}

	// A user's "channel:" sessions count with its others.
	if _, err := h.pool.Exec(ctx, `INSERT INTO sessions (session_id, agent_alias, owner, state, interaction_surface, workspace_dir, cwd)
		SELECT 'sess_b' || i, 'default', $1, 'idle', 'rpc', '', '' FROM generate_series(1, $2) AS i`,
		bob.GetPrincipalId(), MaxOpenSessions); err != nil {
		t.Fatal(err)
	}
	_, err = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, SessionId: "chan_bob", AgentAlias: "default", InteractionSurface: "channel:hook"})
	wantRefusal(t, err, codes.ResourceExhausted, rpcerr.ReasonSessionLimit, "1000 sessions are open for this principal, the limit")
}
