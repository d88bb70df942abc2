package config

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// The seed's own example: after a permission profile named operator
// exists, one set-many creates a whole user.
func TestSeedExampleCreatesUserInOneBatch(t *testing.T) {
	e := newEnv(t, nil)
	e.mustSet(kv{"permission_profiles.operator.permissions", []any{"admin"}})
	_, before := e.storedRevisions()

	resp, err := e.setMany(operator,
		kv{"users.example.uid", 1001},
		kv{"users.example.permission_profiles", []any{"operator"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"users.example.uid", "users.example.permission_profiles"}; !reflect.DeepEqual(resp.GetProps(), want) {
		t.Fatalf("props %v, want %v", resp.GetProps(), want)
	}
	if n, newest := e.storedRevisions(); newest != before+1 || resp.GetRevision() != newest || n != newest {
		t.Fatalf("one commit expected: revision %d -> %d (%d rows), response %d", before, newest, n, resp.GetRevision())
	}
	user, err := e.get("users.example")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"uid": 1001.0, "permission_profiles": []any{"operator"}}; !reflect.DeepEqual(user, want) {
		t.Fatalf("users.example = %v, want %v", user, want)
	}
	// The audit row says who, when and which props.
	var by string
	var props []string
	var at time.Time
	err = e.opts.DB.QueryRow(ctxFor(t), "SELECT committed_by, props, committed_at FROM revisions WHERE revision = $1", resp.GetRevision()).Scan(&by, &props, &at)
	if err != nil || by != OperatorPrincipal || !reflect.DeepEqual(props, resp.GetProps()) || time.Since(at) > time.Minute {
		t.Fatalf("audit row: %q %v %v %v", by, props, at, err)
	}
}

func TestLaterEntriesWin(t *testing.T) {
	e := newEnv(t, nil)
	resp, err := e.setMany(operator,
		kv{"agents.default.model", "first"},
		kv{"agents.default.system_prompt", "be brief"},
		kv{"agents.default.model", "second"},
		kv{"agents.default.model", "third"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"agents.default.model", "agents.default.system_prompt"}; !reflect.DeepEqual(resp.GetProps(), want) {
		t.Fatalf("props %v", resp.GetProps())
	}
	if v, _ := e.get("agents.default.model"); v != "third" {
		t.Fatalf("model %v, want the last entry's value", v)
	}
	if n, _ := e.storedRevisions(); n != 1 {
		t.Fatalf("%d revisions, want one commit", n)
	}
}

func TestBatchSizeBounds(t *testing.T) {
	e := newEnv(t, nil)
	for _, n := range []int{0, 257} {
		sets := make([]kv, n)
		for i := range sets {
			sets[i] = kv{"agents.default.model", fmt.Sprint(i)}
		}
		_, err := e.setMany(operator, sets...)
		st, reason, _ := refusal(t, err)
		if st.Code() != codes.InvalidArgument || reason != rpcerr.ReasonInvalid || wire(err).Code != jsonrpc.CodeInvalidParams ||
			!strings.Contains(st.Message(), "1 to 256") {
			t.Fatalf("%d entries: %v", n, err)
		}
	}
	sets := make([]kv, 256)
	for i := range sets {
		sets[i] = kv{"agents.default.model", fmt.Sprint(i)}
	}
	if _, err := e.setMany(operator, sets...); err != nil {
		t.Fatalf("256 entries: %v", err)
	}
	if n, _ := e.storedRevisions(); n != 1 {
		t.Fatalf("%d revisions after two refusals and one batch", n)
	}
}

// A bad entry names its index and nothing of the batch is applied, not
// even the valid entries before it.
func TestInvalidEntryNamesIndexAndChangesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.mustSet(kv{"agents.default.model", "before"})
	_, rev := e.storedRevisions()
	live := e.srv.current()

	cases := []struct {
		name  string
		entry kv
		msg   string
	}{
		{"type", kv{"rpc.max_local_connections", "many"}, "must be a number"},
		{"range", kv{"rpc.max_local_connections", 0}, "below the minimum"},
		{"integer", kv{"rpc.max_local_connections", 1.5}, "must be an integer"},
		{"enum", kv{"plugins.security.signature_mode", "sometimes"}, "must be one of"},
		{"unknown", kv{"agents.default.colour", "red"}, "unknown config property"},
		{"map", kv{"users", map[string]any{}}, "map of named entries"},
		{"reference", kv{"users.bob.permission_profiles", []any{"nope"}}, `names "nope"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.setMany(operator,
				kv{"agents.default.model", "changed"},
				kv{"agents.default.system_prompt", "changed"},
				kv{"rpc.frame_timeout_ms", 1000},
				c.entry,
				kv{"agents.default.tools", []any{"shell"}})
			st, reason, index := refusal(t, err)
			if st.Code() != codes.InvalidArgument || reason != rpcerr.ReasonInvalid || index != 3 ||
				!strings.HasPrefix(st.Message(), "sets[3]: ") || !strings.Contains(st.Message(), c.msg) {
				t.Fatalf("refusal %v (reason %q index %d)", err, reason, index)
			}
			w := wire(err)
			if w.Code != jsonrpc.CodeInvalidParams || w.Data["index"] != 3 || w.Data["reason"] != "invalid" {
				t.Fatalf("wire error %+v", w)
			}
			if _, newest := e.storedRevisions(); newest != rev {
				t.Fatalf("stored revision moved to %d", newest)
			}
			if e.srv.current() != live {
				t.Fatal("live config changed")
			}
			if v, _ := e.get("agents.default.model"); v != "before" {
				t.Fatalf("model %v", v)
			}
		})
	}
}

// scopedUser creates a user holding Config:Update on the agents' model
// and system prompt only, bound to uid 1001.
func scopedUser(e *env) *commonv1.Principal {
	e.mustSet(
		kv{"permission_profiles.editor.permissions", []any{"Config:Update"}},
		kv{"permission_profiles.editor.config_paths", []any{"agents.*.model", "agents.*.system_prompt"}},
		kv{"users.alice.uid", 1001},
		kv{"users.alice.permission_profiles", []any{"editor"}})
	return userPrincipal("alice", 1001)
}

func TestForbiddenPathRefusesWholeBatch(t *testing.T) {
	e := newEnv(t, nil)
	alice := scopedUser(e)
	if _, err := e.setMany(alice, kv{"agents.default.model", "m1"}, kv{"agents.default.system_prompt", "p1"}); err != nil {
		t.Fatalf("allowed paths: %v", err)
	}
	_, rev := e.storedRevisions()

	_, err := e.setMany(alice,
		kv{"agents.default.model", "m2"},
		kv{"agents.default.system_prompt", "p2"},
		kv{"users.alice.permission_profiles", []any{"editor", "root"}},
		kv{"rpc.max_frame_bytes", "not even valid"})
	st, reason, index := refusal(t, err)
	if st.Code() != codes.PermissionDenied || reason != rpcerr.ReasonForbidden || index != 2 {
		t.Fatalf("refusal %v (reason %q index %d)", err, reason, index)
	}
	if w := wire(err); w.Code != jsonrpc.CodeForbidden || w.Data["reason"] != "forbidden" || w.Data["index"] != 2 {
		t.Fatalf("wire error %+v", w)
	}
	if _, newest := e.storedRevisions(); newest != rev {
		t.Fatal("a forbidden batch was stored")
	}
	if v, _ := e.get("agents.default.model"); v != "m1" {
		t.Fatalf("model %v after a forbidden batch", v)
	}
	// Config:Update itself is needed: a reader is refused at index 0.
	e.mustSet(kv{"permission_profiles.editor.permissions", []any{"Config:Read"}})
	_, err = e.setMany(alice, kv{"agents.default.model", "m3"})
	if _, reason, index := refusal(t, err); reason != rpcerr.ReasonForbidden || index != 0 {
		t.Fatalf("without Config:Update: %v", err)
	}
}

// A failure after staging, inside the transaction, leaves the stored and
// the live config as they were, and a subscriber sees no change.
func TestCommitFailureChangesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.mustSet(kv{"agents.default.model", "stable"})
	cc, err := configclient.New(ctxFor(t), e.rpc, e.nats(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var mu sync.Mutex
	var seen []configclient.Snapshot
	cc.OnChange(func(s configclient.Snapshot, _ []string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s)
	})
	before := cc.Current()
	n0, rev0 := e.storedRevisions()
	live0 := e.srv.current()

	// The database connection dies mid-transaction, after the revision row
	// was inserted: the database is named as unavailable.
	e.srv.hooks.beforeCommit = func(ctx context.Context, tx pgx.Tx) error {
		return tx.Conn().Close(ctx)
	}
	_, err = e.setMany(operator, kv{"agents.default.model", "lost"}, kv{"rpc.max_local_connections", 7})
	st, _, _ := refusal(t, err)
	if st.Code() != codes.Unavailable || wire(err).Code != jsonrpc.CodeInternal || wire(err).Message != "config: database unavailable" {
		t.Fatalf("commit failure reported as %v / %+v", err, wire(err))
	}
	e.srv.hooks.beforeCommit = nil

	if n, rev := e.storedRevisions(); n != n0 || rev != rev0 {
		t.Fatalf("stored revisions %d/%d, were %d/%d", n, rev, n0, rev0)
	}
	if e.srv.current() != live0 {
		t.Fatal("live config changed")
	}
	if v, _ := e.get("agents.default.model"); v != "stable" {
		t.Fatalf("model %v", v)
	}

	// The next commit is the subscriber's next revision; it never saw the
	// failed one.
	e.mustSet(kv{"agents.default.system_prompt", "after"})
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		if cc.Current().Revision != before.Revision+1 {
			return fmt.Errorf("subscriber at revision %d", cc.Current().Revision)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0].String("agents.default.model") != "stable" || seen[0].Int("rpc.max_local_connections") != 512 {
		t.Fatalf("subscriber saw %+v", seen)
	}
}

// 20 clients race batches over overlapping props: every stored revision,
// and the end state, is one submitted candidate whole.
func TestConcurrentBatchesNeverMix(t *testing.T) {
	e := newEnv(t, nil)
	const clients = 20
	props := []string{"agents.default.model", "agents.default.system_prompt", "agents.default.base_url", "agents.work.model"}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each client writes its own subset, overlapping the others.
			var sets []kv
			for j, p := range props {
				if (i+j)%4 != 3 {
					v := fmt.Sprintf("c%d", i)
					if strings.HasSuffix(p, "base_url") {
						v = fmt.Sprintf("https://c%d.example", i)
					}
					sets = append(sets, kv{p, v})
				}
			}
			if _, err := e.setMany(operator, sets...); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n, newest := e.storedRevisions()
	if n != clients || newest != clients {
		t.Fatalf("%d revisions, newest %d; want %d", n, newest, clients)
	}
	// Replay: each revision's props must all carry its own client's value.
	rows, err := e.opts.DB.Query(ctxFor(t), "SELECT revision, props, document FROM revisions ORDER BY revision")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lastDoc map[string]any
	for rows.Next() {
		var rev int64
		var changed []string
		var doc map[string]any
		if err := rows.Scan(&rev, &changed, &doc); err != nil {
			t.Fatal(err)
		}
		lastDoc = doc
		owner := ""
		for _, p := range changed {
			v := fmt.Sprint(lookup(doc, p))
			v = strings.TrimSuffix(strings.TrimPrefix(v, "https://"), ".example")
			if owner == "" {
				owner = v
			} else if v != owner {
				t.Fatalf("revision %d mixes %s and %s: %v", rev, owner, v, doc)
			}
		}
	}
	// The live config is the newest stored revision.
	for _, p := range props {
		live, err := e.get(p)
		if err != nil {
			t.Fatal(err)
		}
		if stored := lookup(lastDoc, p); live != stored {
			t.Fatalf("live %s = %v, stored %v", p, live, stored)
		}
	}
}

// A revocation committed while a batch waits for the write lock refuses
// the batch when it gets the lock.
func TestRevocationWhileWaitingRefusesBatch(t *testing.T) {
	for _, how := range []string{"profile", "token"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t, nil)
			alice := scopedUser(e)
			if how == "token" {
				tok, err := e.rpc.CreateToken(ctxFor(t), &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
				if err != nil {
					t.Fatal(err)
				}
				resp, err := e.rpc.ResolvePrincipal(ctxFor(t), &configv1.ResolvePrincipalRequest{PeerUid: 4242, AuthToken: tok.GetToken()})
				if err != nil {
					t.Fatal(err)
				}
				alice = resp.GetPrincipal()
			}
			if _, err := e.setMany(alice, kv{"agents.default.model", "allowed"}); err != nil {
				t.Fatal(err)
			}

			// The revocation takes the lock first and holds it until alice's
			// batch is queued behind it.
			release := make(chan struct{})
			inRevocation := make(chan struct{})
			var once sync.Once
			e.srv.hooks.locked = func() {
				once.Do(func() { close(inRevocation); <-release })
			}
			revoked := make(chan error, 1)
			go func() {
				if how == "token" {
					_, err := e.rpc.RevokeToken(ctxFor(t), &configv1.RevokeTokenRequest{Principal: operator, User: "alice"})
					revoked <- err
					return
				}
				_, err := e.setMany(operator, kv{"users.alice.permission_profiles", []any{}})
				revoked <- err
			}()
			testwait.Recv(t, inRevocation)
			batch := make(chan error, 1)
			go func() {
				_, err := e.setMany(alice, kv{"agents.default.model", "after revocation"})
				batch <- err
			}()
			testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
				if e.srv.waiting.Load() == 0 {
					return errors.New("batch not waiting for the lock yet")
				}
				return nil
			})
			close(release)
			if err := <-revoked; err != nil {
				t.Fatal(err)
			}
			err := <-batch
			if _, reason, index := refusal(t, err); reason != rpcerr.ReasonForbidden || index != 0 {
				t.Fatalf("batch after revocation: %v", err)
			}
			if v, _ := e.get("agents.default.model"); v != "allowed" {
				t.Fatalf("model %v", v)
			}
		})
	}
}

func lookup(doc map[string]any, path string) any {
	var cur any = doc
	for _, seg := range strings.Split(path, ".") {
		m, _ := cur.(map[string]any)
		cur = m[seg]
	}
	return cur
}

// A user allowed to edit agents' system prompts set three of 6 MiB: each
// was stored, and the document (19 MB) passed the 16 MiB a gRPC message
// may be, so no service could read the live config any more, nor start
// again: the stack was down for good. A commit that takes the document
// past configschema.MaxDocumentBytes is refused, naming the largest value
// of its batch; the live config stays readable.
func TestDocumentBoundKeepsConfigReadable(t *testing.T) {
	e := newEnv(t, nil)
	alice := scopedUser(e)
	_, rev := e.storedRevisions()
	big := strings.Repeat("p", 6<<20)
	for _, a := range []string{"a", "b", "c"} {
		_, err := e.setMany(alice, kv{"agents." + a + ".model", "m"}, kv{"agents." + a + ".system_prompt", big})
		st, reason, index := refusal(t, err)
		if st.Code() != codes.InvalidArgument || reason != rpcerr.ReasonInvalid || index != 1 ||
			!strings.Contains(st.Message(), "; the limit is 4194304") {
			t.Fatalf("a 6 MiB system prompt: %v (reason %q index %d)", err, reason, index)
		}
	}
	if _, newest := e.storedRevisions(); newest != rev {
		t.Fatalf("stored revision moved to %d", newest)
	}
	// Up to the bound, prompts are kept; the one past it is refused.
	e2 := strings.Repeat("q", 2<<20)
	if _, err := e.setMany(alice, kv{"agents.a.system_prompt", e2}); err != nil {
		t.Fatal(err)
	}
	_, err := e.setMany(alice, kv{"agents.b.system_prompt", e2}, kv{"agents.b.model", "m"})
	if _, _, index := refusal(t, err); index != 0 {
		t.Fatalf("the document past its bound by a second 2 MiB prompt: %v", err)
	}
	live, err := e.rpc.Live(ctxFor(t), &configv1.LiveRequest{})
	if err != nil {
		t.Fatalf("live config: %v", err)
	}
	if got := live.GetDocument().GetFields()["agents"].GetStructValue().GetFields()["a"].GetStructValue().GetFields()["system_prompt"].GetStringValue(); got != e2 {
		t.Fatalf("the prompt within the bound: %d bytes", len(got))
	}
}

// A document stored past the bound (by a version before it) can still be
// made smaller, not larger.
func TestDocumentPastBoundMayShrink(t *testing.T) {
	over := map[string]any{"agents": map[string]any{"a": map[string]any{"system_prompt": strings.Repeat("p", 5<<20)}}}
	smaller := map[string]any{"agents": map[string]any{"a": map[string]any{"system_prompt": strings.Repeat("p", 5<<20-1)}}}
	larger := map[string]any{"agents": map[string]any{"a": map[string]any{"system_prompt": strings.Repeat("p", 5<<20+1)}}}
	if err := withinBound(smaller, over, []write{{prop: "agents.a.system_prompt", value: "x"}}); err != nil {
		t.Fatalf("shrinking: %v", err)
	}
	if err := withinBound(larger, over, []write{{prop: "agents.a.system_prompt", value: "x"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("growing: %v", err)
	}
}
