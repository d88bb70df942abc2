package config

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/policylock"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// policyWaiters counts database sessions waiting for the policy lock.
func (e *env) policyWaiters() int {
	e.t.Helper()
	var n int
	if err := e.opts.DB.QueryRow(ctxFor(e.t), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::oid AND objid = $2::oid AND objsubid = 2 AND NOT granted`,
		uint32(policylock.Class), uint32(policylock.Policy)).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// Every write of the policy (a config commit, pairing or unpairing a
// token) waits for a file store that holds the policy lock shared, and
// Authorize keeps answering from the old policy until the store let go:
// the session service's check-then-write is never split by a change.
func TestPolicyWritesWaitForCheckedStores(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	e.mustSet(
		kv{"permission_profiles.up.permissions", []any{"files:create"}},
		kv{"users.alice.permission_profiles", []any{"up"}},
	)
	tok, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	alice := userPrincipal("alice", 0)
	alice.TokenId = tokenID(tok.GetToken())
	allowed := func() bool {
		resp, err := e.rpc.Authorize(ctx, &configv1.AuthorizeRequest{Principal: alice, Permission: "files:create"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAllowed()
	}

	for _, change := range []struct {
		name  string
		write func() error
	}{
		{"config commit", func() error {
			_, err := e.setMany(operator, kv{"permission_profiles.up.permissions", []any{}})
			return err
		}},
		{"unpairing", func() error {
			_, err := e.rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: "alice"})
			return err
		}},
	} {
		t.Run(change.name, func(t *testing.T) {
			if !allowed() {
				t.Fatal("alice may not create files before the change")
			}
			store, err := e.opts.DB.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Rollback(context.Background()) //nolint:errcheck
			if err := policylock.Shared(ctx, store); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- change.write() }()
			testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
				if e.policyWaiters() != 1 {
					return errors.New("the write is not waiting for the store")
				}
				return nil
			})
			if !allowed() {
				t.Fatal("the change applied while a checked store held the policy")
			}
			if err := store.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if allowed() {
				t.Fatal("the change did not apply")
			}
			// Restore for the next case.
			e.mustSet(kv{"permission_profiles.up.permissions", []any{"files:create"}})
		})
	}
}
