// Package policylock orders changes of the authorization policy against
// the writes that were checked under it, across processes.
//
// The policy (the config document's users, permission profiles and paired
// tokens) is the config service's; a store into a session workspace is
// the session service's. A store checks the caller's grants and then
// writes: a policy change must not fall between the two. Both sides take
// one PostgreSQL advisory lock in the database they share:
//
//   - the config service holds it exclusively (Exclusive) from the moment
//     a write resolves the caller's authority until its new snapshot is
//     live, so Authorize never answers from a policy older than a
//     committed write while the lock is free;
//   - the session service holds it shared (Shared, inside its store
//     transaction) from before it asks Authorize until the stored file is
//     committed.
//
// So a policy write waits for every store already checked, and a store
// that starts checking while a write is pending waits for the new policy
// to be live: each store is ordered wholly before or wholly after each
// policy change. Stores do not wait for each other.
//
// The lock uses PostgreSQL's two-key form, whose key space is distinct
// from the one-key locks internal/pg takes for migrations.
package policylock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The two keys of the lock: Class is Clawmesh's ("CMSH"), Policy the
// authorization policy.
const (
	Class  int32 = 0x434d5348
	Policy int32 = 1
)

// releaseTimeout bounds the unlock at release.
const releaseTimeout = 5 * time.Second

// Shared takes the lock in shared mode until tx ends. It waits while a
// policy write holds or awaits the lock, at most until ctx ends.
func Shared(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1, $2)", Class, Policy); err != nil {
		return fmt.Errorf("policy lock (shared): %w", err)
	}
	return nil
}

// Exclusive takes the lock exclusively on one connection of pool and
// returns the function that releases it (call it exactly once). It waits
// for every shared holder, at most until ctx ends.
func Exclusive(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("policy lock: acquire connection: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", Class, Policy); err != nil {
		// A cancelled wait may leave the connection mid-query: drop it
		// rather than return it to the pool.
		_ = conn.Conn().Close(context.Background())
		conn.Release()
		return nil, fmt.Errorf("policy lock: %w", err)
	}
	return func() {
		// A fresh context: the unlock must happen even when the caller's
		// context is done. If it fails, closing the connection ends the
		// database session, which drops the lock with it.
		uctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1, $2)", Class, Policy); err != nil {
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}, nil
}
