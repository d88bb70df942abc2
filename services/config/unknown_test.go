package config

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// lossyDB relays the config service's PostgreSQL connections through a
// socket of its own. Armed with a marker, it lets the statement holding
// it reach the server and run, then drops the server's answer, and
// reports that on lost: the test then takes the database away (down)
// before the service can check what happened, as when the server crashes
// right after a COMMIT.
type lossyDB struct {
	t      *testing.T
	url    string // through the relay
	direct string // to the server itself
	path   string
	target string
	marker atomic.Pointer[[]byte]
	lost   chan struct{}
	relay  *testenv.Relay
}

func startLossyDB(t *testing.T) *lossyDB {
	t.Helper()
	direct := testenv.Postgres(t)
	r := testenv.RelayPostgres(t, direct)
	d := &lossyDB{t: t, url: r.URL, direct: direct, path: r.Path, target: r.Target, lost: make(chan struct{}, 1)}
	d.up()
	return d
}

// arm drops the answer to the next statement that holds marker, once it
// has been sent to be run.
func (d *lossyDB) arm(marker string) {
	m := []byte(marker)
	d.marker.Store(&m)
}

// up relays connections again (again after down).
func (d *lossyDB) up() {
	d.relay = testenv.StartRelay(d.t, d.path, d.target, func() testenv.RelayHook {
		var seen, dropping atomic.Bool // the client's direction sets them
		return func(toTarget bool, chunk []byte) bool {
			if !toTarget {
				if dropping.Load() {
					select {
					case d.lost <- struct{}{}:
					default:
					}
					return false
				}
				return true
			}
			m := d.marker.Load()
			if m == nil {
				return true
			}
			if bytes.Contains(bytes.ToLower(chunk), *m) {
				seen.Store(true)
			}
			if seen.Load() && runs(chunk) && d.marker.CompareAndSwap(m, nil) {
				dropping.Store(true)
			}
			return true
		}
	})
}

// conn is a connection to the server itself, for the test's own reads.
func (d *lossyDB) conn() *pgx.Conn {
	d.t.Helper()
	c, err := pgx.Connect(ctxFor(d.t), d.direct)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// storedModel is agents.default.model in stored revision rev.
func (d *lossyDB) storedModel(rev int64) string {
	d.t.Helper()
	var model *string
	err := d.conn().QueryRow(ctxFor(d.t), "SELECT document->'agents'->'default'->>'model' FROM config.revisions WHERE revision = $1", rev).Scan(&model)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ""
	case err != nil:
		d.t.Fatal(err)
	case model == nil:
		return ""
	}
	return *model
}

// down closes every relayed connection and refuses new ones.
func (d *lossyDB) down() { d.relay.Close() }

// runs reports whether a chunk of the frontend protocol asks the server to
// run something: a simple Query or an Execute.
func runs(chunk []byte) bool {
	for len(chunk) >= 5 {
		n := int(binary.BigEndian.Uint32(chunk[1:5]))
		if chunk[0] == 'Q' || chunk[0] == 'E' {
			return true
		}
		if n < 4 || 1+n > len(chunk) {
			return false
		}
		chunk = chunk[1+n:]
	}
	return false
}

// A COMMIT the server runs but whose answer the service never sees, the
// database gone before it can check: the caller is told the database is
// unavailable, the revision is stored all the same. The next write must
// not reuse its number (before the service reloaded after such a write,
// every later commit failed as a duplicate revision, an internal error,
// until a restart), and the live config must be what the database holds.
func TestCommitOfUnknownOutcomeIsReloaded(t *testing.T) {
	db := startLossyDB(t)
	e := newEnvOn(t, db.url, nil)
	rev := e.mustSet(kv{"agents.default.model", "one"})

	err := db.cut("commit", func() error {
		_, err := e.setMany(operator, kv{"agents.default.model", "two"})
		return err
	})
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "database unavailable" {
		t.Fatalf("the write of unknown outcome: %v, want Unavailable \"database unavailable\"", err)
	}
	if v := db.storedModel(rev + 1); v != "two" {
		t.Fatalf("revision %d holds %q: the COMMIT did not run, the test shows nothing", rev+1, v)
	}
	db.up()

	got, err := e.setMany(operator, kv{"agents.default.model", "three"})
	if err != nil {
		t.Fatalf("the next write: %v", err)
	}
	if got.GetRevision() != rev+2 {
		t.Fatalf("the next write committed revision %d, want %d", got.GetRevision(), rev+2)
	}
	if v, err := e.get("agents.default.model"); err != nil || v != "three" {
		t.Fatalf("live after the next write: %v %v", v, err)
	}
}

// Without a next write, Run reloads once the database answers: reads give
// what the write of unknown outcome stored.
func TestRunReloadsAfterAWriteOfUnknownOutcome(t *testing.T) {
	db := startLossyDB(t)
	e := newEnvOn(t, db.url, nil)
	rev := e.mustSet(kv{"agents.default.model", "one"})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	err := db.cut("commit", func() error {
		_, err := e.setMany(operator, kv{"agents.default.model", "two"})
		return err
	})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the write of unknown outcome: %v", err)
	}
	// Down for a few of Run's turns: it keeps trying.
	time.Sleep(3 * ReconcileEvery)
	db.up()
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		live, err := e.rpc.Live(ctxFor(t), &configv1.LiveRequest{})
		if err != nil {
			return err
		}
		if live.GetRevision() != rev+1 {
			return errors.New("the live revision is not the stored one yet")
		}
		if v, err := e.get("agents.default.model"); err != nil || v != "two" {
			return errors.New("the model read is not the stored one yet")
		}
		return nil
	})
}

// A revoke the server runs but whose answer is lost: the token must not
// stay live in the service once the database answers again.
func TestRevokeOfUnknownOutcomeIsReloaded(t *testing.T) {
	db := startLossyDB(t)
	e := newEnvOn(t, db.url, nil)
	ctx := ctxFor(t)
	scopedUser(e) // alice
	tok, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func() error {
		_, err := e.rpc.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: int32(os.Getuid()), PeerPid: 7, AuthToken: tok.GetToken()})
		return err
	}
	if err := resolve(); err != nil {
		t.Fatal(err)
	}

	err = db.cut("update tokens set revoked_at", func() error {
		_, err := e.rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: "alice"})
		return err
	})
	// Its error is the process frame's to class (grpcserver, with
	// pg.IsUnavailable); this server is a bare one.
	if err == nil {
		t.Fatal("the revoke of unknown outcome succeeded")
	}
	var revoked bool
	if err := db.conn().QueryRow(ctx, "SELECT revoked_at IS NOT NULL FROM config.tokens WHERE token_hash = $1", tokenID(tok.GetToken())).Scan(&revoked); err != nil || !revoked {
		t.Fatalf("the token is not revoked in the database (%v): the test shows nothing", err)
	}
	db.up()

	// The next write reloads first; the token is refused from then on.
	e.mustSet(kv{"agents.default.model", "after"})
	if err := resolve(); wire(err).Code != jsonrpc.CodeAuthRequired {
		t.Fatalf("the token revoked in the database still resolves: %v", err)
	}
}

// cut runs call with marker armed: once the statement holding it has run
// and its answer is dropped, the database goes away (down); it returns
// call's error.
func (d *lossyDB) cut(marker string, call func() error) error {
	d.t.Helper()
	d.arm(marker)
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case <-d.lost:
	case <-time.After(20 * time.Second):
		d.t.Fatal("the armed statement never ran")
	}
	d.down()
	return <-done
}

// A commit that lands after the check read (a COMMIT the server was still
// running) leaves a revision the snapshot lacks even when the check saw
// none: here it is inserted behind the service's back. The write that
// meets it reloads and is staged again on top of it (it failed before,
// as a duplicate revision, an internal error for a sound write); the
// late revision's change is kept.
func TestARevisionLandedLateIsReloaded(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	rev := e.mustSet(kv{"agents.default.model", "one"})
	if _, err := e.opts.DB.Exec(ctx, `INSERT INTO revisions (revision, document, committed_by)
		VALUES ($1, '{"agents":{"default":{"model":"late"}}}', 'late')`, rev+1); err != nil {
		t.Fatal(err)
	}
	got, err := e.setMany(operator, kv{"agents.default.system_prompt", "two"})
	if err != nil {
		t.Fatalf("a write over a revision stored behind the snapshot: %v", err)
	}
	if got.GetRevision() != rev+2 {
		t.Fatalf("the write committed revision %d, want %d", got.GetRevision(), rev+2)
	}
	if v, err := e.get("agents.default.model"); err != nil || v != "late" {
		t.Fatalf("the model after the reload: %v %v, want the late revision's", v, err)
	}
	if v, err := e.get("agents.default.system_prompt"); err != nil || v != "two" {
		t.Fatalf("the write's own prop: %v %v", v, err)
	}
}
