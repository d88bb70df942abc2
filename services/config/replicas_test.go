package config

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// Two config processes on one database (two replicas, or an old process
// still running beside its replacement): each served the snapshot it
// loaded at its start, changed only by its own writes. A change
// committed through one was never seen by the other (its Live, Get and
// ResolvePrincipal went on with the old values, and the consumers that
// read from it too), and a token revoked through one still bound its
// user through the other, for as long as it ran. Each now reads what
// the database holds once it changed.
func TestReplicaServesWhatAnotherCommitted(t *testing.T) {
	a := newEnv(t, nil)
	ctx := ctxFor(t)
	b, err := New(ctx, a.opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); b.Run(runCtx) }()
	t.Cleanup(func() { stop(); testwait.Recv(t, ran) })

	rev := a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		live, err := b.Live(ctx, &configv1.LiveRequest{})
		if err != nil {
			return err
		}
		got, err := b.Get(ctx, &configv1.GetRequest{Principal: operator, Prop: "rpc.call_timeout_ms"})
		if err != nil {
			return err
		}
		if live.GetRevision() != rev || got.GetValue().GetNumberValue() != 2500 {
			return fmt.Errorf("the other replica serves revision %d, rpc.call_timeout_ms %v; want %d, 2500",
				live.GetRevision(), got.GetValue().AsInterface(), rev)
		}
		return nil
	})

	// A token paired through one replica binds through the other, and
	// once revoked through the first binds through neither.
	scopedUser(a)
	tok, err := a.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func() error {
		_, err := b.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: 4242, PeerPid: 7, AuthToken: tok.GetToken()})
		return err
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, resolve)
	if _, err := a.rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: "alice"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		if resolve() == nil {
			return errors.New("a token revoked through the other replica still binds")
		}
		return nil
	})
}

// A write through a process whose snapshot another's commit has passed
// (before its follow read it, or a commit of unknown outcome that landed
// after the reload) took the revision number the database already held:
// the caller got Internal "commit failed: ... duplicate key", though
// nothing was wrong with its write (the stack's e2e test of backends
// killed under traffic saw it as "config failed"). The write is now
// staged again on what the database holds and committed as the next
// revision, once.
func TestWriteAfterAnotherCommittedTakesTheNextRevision(t *testing.T) {
	a := newEnv(t, nil)
	ctx := ctxFor(t)
	b, err := New(ctx, a.opts) // no Run: it has not read a's commit
	if err != nil {
		t.Fatal(err)
	}
	rev := a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	resp, err := b.SetMany(ctx, &configv1.SetManyRequest{Principal: operator, Sets: entries(t, kv{"agents.default.model", "other"})})
	if err != nil {
		t.Fatalf("a write through the replica behind: %v", err)
	}
	if resp.GetRevision() != rev+1 {
		t.Fatalf("the write committed revision %d, want %d", resp.GetRevision(), rev+1)
	}
	// Staged on what the database held: a's change is kept.
	got, err := b.Get(ctx, &configv1.GetRequest{Principal: operator, Prop: "rpc.call_timeout_ms"})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetValue().GetNumberValue() != 2500 {
		t.Fatalf("rpc.call_timeout_ms after the replica's write: %v, want a's 2500 kept", got.GetValue().AsInterface())
	}
}

// A database reset or replaced under a running config process (here:
// its newest revisions removed) was reloaded, but announced only when it
// brought a newer revision: its consumers, which take a lower revision
// the service serves as a new history, waited for their next resync
// (30 s). The lower revision is now announced as a newer one is.
func TestLowerRevisionInTheDatabaseIsAnnounced(t *testing.T) {
	a := newEnv(t, nil)
	ctx := ctxFor(t)
	first := a.mustSet(kv{"rpc.call_timeout_ms", 2500})
	a.mustSet(kv{"rpc.call_timeout_ms", 3500})
	announced := make(chan int64, 16)
	nc := a.nats()
	sub, err := bus.SubscribeConfigChanged(nc, func(ch *busv1.ConfigChanged) { announced <- ch.GetRevision() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck // the connection may be closed already
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); a.srv.Run(runCtx) }()
	t.Cleanup(func() { stop(); testwait.Recv(t, ran) })

	if _, err := a.opts.DB.Exec(ctx, "DELETE FROM revisions WHERE revision > $1", first); err != nil {
		t.Fatal(err)
	}
	for {
		rev := testwait.Recv(t, announced)
		if rev == first {
			break
		}
		t.Logf("announced %d", rev)
	}
	live, err := a.rpc.Live(ctx, &configv1.LiveRequest{})
	if err != nil || live.GetRevision() != first {
		t.Fatalf("live after the reset: %v, %v; want revision %d", live.GetRevision(), err, first)
	}
}
