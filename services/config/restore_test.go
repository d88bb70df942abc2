package config

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// running runs e's server (its follow of the database) until the test ends.
func (e *env) running(t *testing.T) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); e.srv.Run(ctx) }()
	t.Cleanup(func() { stop(); testwait.Recv(t, ran) })
}

// followerHolds waits until c holds revision rev with rpc.call_timeout_ms ms.
func followerHolds(t *testing.T, c *configclient.Client, rev int64, ms float64) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := timeoutOf(c); got != ms || c.Current().Revision != rev {
			return fmt.Errorf("follower at revision %d, rpc.call_timeout_ms %v; want %d, %v", c.Current().Revision, got, rev, ms)
		}
		return nil
	})
}

// An older dump of the config database restored into it (pg_restore),
// then committed on up to the revision number its consumers held: the
// restored history keeps its id, and its numbers meet the ones read, so
// a consumer that read revision 3 before the restore kept its document
// (2700) where the service served the restored history's revision 3
// (3700), for ever: each read found the number it held. Each revision
// now carries its stored document's digest, and one held with another
// digest is read again.
func TestRestoredHistoryAtTheNumbersHeldIsFollowed(t *testing.T) {
	url := testenv.Postgres(t)
	a := newEnvOn(t, url, nil)
	a.running(t)
	a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	dump := filepath.Join(t.TempDir(), "config.dump")
	testenv.PGTool(t, "pg_dump", "--format=custom", "--schema=config", "--file="+dump, url)
	a.mustSet(kv{"rpc.call_timeout_ms", 2600})
	held := a.mustSet(kv{"rpc.call_timeout_ms", 2700})
	c := followerOf(t, a, &switchable{srv: a.srv})
	followerHolds(t, c, held, 2700)

	testenv.PGTool(t, "pg_restore", "--clean", "--if-exists", "--single-transaction", "--schema=config", "--dbname="+url, dump)
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		if v, err := a.get("rpc.call_timeout_ms"); err != nil || v != float64(2500) {
			return fmt.Errorf("the service serves rpc.call_timeout_ms %v (%v), want the restored 2500", v, err)
		}
		return nil
	})
	// Before the follower confirms the lower revision (2 s), the
	// restored history is back at the number it holds.
	a.mustSet(kv{"rpc.call_timeout_ms", 3600})
	if rev := a.mustSet(kv{"rpc.call_timeout_ms", 3700}); rev != held {
		t.Fatalf("the restored history's commit is revision %d, want %d (the number held)", rev, held)
	}
	followerHolds(t, c, held, 3700)
}

// The newest revision's row rewritten in the database: the service
// compared its newest number, token counts and history id, all the same,
// and served the old document until it restarted, and its consumers
// kept it even then. The row's digest is now part of what the service
// compares, and what its consumers compare.
func TestRewrittenRevisionIsFollowed(t *testing.T) {
	url := testenv.Postgres(t)
	a := newEnvOn(t, url, nil)
	a.running(t)
	rev := a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	c := followerOf(t, a, &switchable{srv: a.srv})
	followerHolds(t, c, rev, 2500)

	ctx := ctxFor(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, `UPDATE config.revisions SET document = jsonb_set(document, '{rpc,call_timeout_ms}', '4500') WHERE revision = $1`, rev)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("rewrite revision %d: %v (%d rows)", rev, err, tag.RowsAffected())
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		if v, err := a.get("rpc.call_timeout_ms"); err != nil || v != float64(4500) {
			return fmt.Errorf("the service serves rpc.call_timeout_ms %v (%v), want the rewritten 4500", v, err)
		}
		return nil
	})
	followerHolds(t, c, rev, 4500)
}

// The database brought back, by a restore, to the very fingerprint the
// service's follow last read, before its own later commits: follow
// compared the fingerprint with the one it had read, found it the same,
// and served the commits the database no longer held (2700 for 2500),
// for ever. Its own writes now make the next follow reload.
func TestRestoreToTheFingerprintLastReadIsFollowed(t *testing.T) {
	url := testenv.Postgres(t)
	a := newEnvOn(t, url, nil)
	a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	if err := a.srv.follow(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "config.dump")
	testenv.PGTool(t, "pg_dump", "--format=custom", "--schema=config", "--file="+dump, url)
	a.mustSet(kv{"rpc.call_timeout_ms", 2600})
	a.mustSet(kv{"rpc.call_timeout_ms", 2700})
	testenv.PGTool(t, "pg_restore", "--clean", "--if-exists", "--single-transaction", "--schema=config", "--dbname="+url, dump)
	if err := a.srv.follow(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if v, err := a.get("rpc.call_timeout_ms"); err != nil || v != float64(2500) {
		t.Fatalf("after the restore the service serves rpc.call_timeout_ms %v (%v), want the restored 2500", v, err)
	}
}

// A write right after a restore, before the service's follow read it
// (within its second): the write staged on the live snapshot, of the
// history the restore took away, and stored it as the next number after
// that snapshot's, so the restored document (2500) was lost under the
// old one's value (2600) and the numbers skipped the restored history's.
// A commit now checks, in its transaction, that the database's newest
// revision is the one it builds on, and stages again on what the
// database holds when it is not.
func TestWriteRightAfterARestoreBuildsOnTheRestoredHistory(t *testing.T) {
	url := testenv.Postgres(t)
	a := newEnvOn(t, url, nil) // not running: no follow reads the restore first
	restored := a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	dump := filepath.Join(t.TempDir(), "config.dump")
	testenv.PGTool(t, "pg_dump", "--format=custom", "--schema=config", "--file="+dump, url)
	a.mustSet(kv{"rpc.call_timeout_ms", 2600})
	testenv.PGTool(t, "pg_restore", "--clean", "--if-exists", "--single-transaction", "--schema=config", "--dbname="+url, dump)

	rev := a.mustSet(kv{"plugins.scan_interval_ms", 300})
	if rev != restored+1 {
		t.Fatalf("the write after the restore is revision %d, want %d (next of the restored history)", rev, restored+1)
	}
	if v, err := a.get("rpc.call_timeout_ms"); err != nil || v != float64(2500) {
		t.Fatalf("after a write on the restored history the service serves rpc.call_timeout_ms %v (%v), want the restored 2500", v, err)
	}
	// What the database holds agrees.
	b := newEnvOn(t, url, nil)
	if v, err := b.get("rpc.call_timeout_ms"); err != nil || v != float64(2500) {
		t.Fatalf("the database holds rpc.call_timeout_ms %v (%v), want the restored 2500", v, err)
	}
}

// A follower that held revision 2 of the old history and read revision 3
// of a restored one, whose revision 2 it never saw (committed by a
// process that announced nothing, here one with no bus): 3 follows the
// 2 it held by number, so its watchers were told only 3's props
// (plugins.scan_interval_ms) and not rpc.call_timeout_ms, which the
// restored 2 had changed. Each announcement now names the digest of the
// revision it was staged on; a follower holding another takes the props
// as not the whole difference (nil: anything may have changed).
func TestFollowerJumpingOntoARestoredHistoryIsToldEverything(t *testing.T) {
	url := testenv.Postgres(t)
	a := newEnvOn(t, url, nil)
	a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	dump := filepath.Join(t.TempDir(), "config.dump")
	testenv.PGTool(t, "pg_dump", "--format=custom", "--schema=config", "--file="+dump, url)
	held := a.mustSet(kv{"rpc.call_timeout_ms", 2600})
	target := &switchable{srv: a.srv}
	c := followerOf(t, a, target)
	followerHolds(t, c, held, 2600)
	type change struct {
		rev   int64
		props []string
	}
	changes := make(chan change, 16)
	c.OnChange(func(s configclient.Snapshot, props []string) {
		select {
		case changes <- change{s.Revision, props}:
		default:
		}
	})

	testenv.PGTool(t, "pg_restore", "--clean", "--if-exists", "--single-transaction", "--schema=config", "--dbname="+url, dump)
	ctx := ctxFor(t)
	silent, err := New(ctx, Options{DB: a.opts.DB, DataDir: a.opts.DataDir, Log: a.opts.Log}) // no bus: announces nothing
	if err != nil {
		t.Fatal(err)
	}
	if _, err := silent.commit(ctx, commitRequest{who: audit{by: "test"}, writes: []write{{prop: "rpc.call_timeout_ms", value: 3600}}}); err != nil {
		t.Fatal(err)
	}
	b, err := New(ctx, a.opts) // on a's bus, from the restored revision 2
	if err != nil {
		t.Fatal(err)
	}
	target.to(b)
	snap, err := b.commit(ctx, commitRequest{who: audit{by: "test"}, writes: []write{{prop: "plugins.scan_interval_ms", value: 300}}})
	if err != nil {
		t.Fatal(err)
	}
	if snap.revision != held+1 {
		t.Fatalf("the restored history's commit is revision %d, want %d", snap.revision, held+1)
	}
	followerHolds(t, c, held+1, 3600)
	got := testwait.Recv(t, changes)
	if got.rev != held+1 || (got.props != nil && !slices.Contains(got.props, "rpc.call_timeout_ms")) {
		t.Fatalf("the follower's watchers were told revision %d with props %v: rpc.call_timeout_ms changed too", got.rev, got.props)
	}
}
