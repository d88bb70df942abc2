package policylock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/clawmesh/clawmesh/internal/policylock"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// waiting counts sessions waiting for the policy lock.
func waiting(t *testing.T, p *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := p.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::oid AND objid = $2::oid AND objsubid = 2 AND NOT granted`,
		uint32(policylock.Class), uint32(policylock.Policy)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, p *pgxpool.Pool, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		if waiting(t, p) != n {
			return errors.New("not waiting yet")
		}
		return nil
	})
}

// A policy write waits for a store that holds the lock shared, and a
// store that starts while the write holds it waits for the write; stores
// do not wait for each other.
func TestExclusiveWaitsForSharedAndBack(t *testing.T) {
	p := pool(t)
	ctx := context.Background()

	store1, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := policylock.Shared(ctx, store1); err != nil {
		t.Fatal(err)
	}
	store2, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := policylock.Shared(ctx, store2); err != nil {
		t.Fatalf("a second store waited for the first: %v", err)
	}

	got := make(chan func(), 1)
	go func() {
		release, err := policylock.Exclusive(ctx, p)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- release
	}()
	waitFor(t, p, 1)
	_ = store1.Commit(ctx)
	select {
	case <-got:
		t.Fatal("the write got the lock while a store still held it")
	default:
	}
	_ = store2.Rollback(ctx)
	release := testwait.Recv(t, got)
	if release == nil {
		t.Fatal("no lock")
	}

	// A store starting now waits for the write to release.
	store3, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer store3.Rollback(ctx) //nolint:errcheck
	shared := make(chan error, 1)
	go func() { shared <- policylock.Shared(ctx, store3) }()
	waitFor(t, p, 1)
	release()
	if err := testwait.Recv(t, shared); err != nil {
		t.Fatal(err)
	}
}

// A wait cut short by its context leaves nothing held.
func TestExclusiveGivesUpWithItsContext(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := policylock.Shared(ctx, tx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := policylock.Exclusive(short, p)
		done <- err
	}()
	waitFor(t, p, 1)
	cancel()
	if err := testwait.Recv(t, done); err == nil {
		t.Fatal("Exclusive succeeded while a store held the lock")
	}
	_ = tx.Commit(ctx)
	release, err := policylock.Exclusive(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	release()
	var tx2 pgx.Tx
	if tx2, err = p.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx) //nolint:errcheck
	if err := policylock.Shared(ctx, tx2); err != nil {
		t.Fatal(err)
	}
}
