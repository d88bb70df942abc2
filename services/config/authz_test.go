package config

import (
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

func TestResolvePrincipal(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	scopedUser(e) // alice, uid 1001
	resolve := func(uid int32, token string) (*commonv1.Principal, error) {
		resp, err := e.rpc.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: uid, PeerPid: 7, AuthToken: token})
		return resp.GetPrincipal(), err
	}
	if p, err := resolve(int32(os.Getuid()), ""); err != nil || p.GetPrincipalId() != OperatorPrincipal || !p.GetOperator() {
		t.Fatalf("daemon uid: %v %v", p, err)
	}
	if p, err := resolve(1001, ""); err != nil || p.GetPrincipalId() != "user:alice" || p.GetOperator() || p.GetTokenId() != "" {
		t.Fatalf("users.alice.uid: %v %v", p, err)
	}
	if _, err := resolve(4242, ""); wire(err).Code != jsonrpc.CodeAuthRequired {
		t.Fatalf("unknown uid: %v", err)
	}

	// A token pairs only with an existing user, only by the operator.
	if _, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "ghost"}); wire(err).Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("token for a missing user: %v", err)
	}
	if _, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: userPrincipal("alice", 1001), User: "alice"}); wire(err).Code != jsonrpc.CodeForbidden {
		t.Fatalf("token by a user: %v", err)
	}
	tok, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := e.opts.DB.QueryRow(ctx, "SELECT token_hash FROM tokens").Scan(&stored); err != nil || stored == tok.GetToken() || stored != tokenID(tok.GetToken()) {
		t.Fatalf("token stored as %q (%v)", stored, err)
	}
	// The token wins over the daemon's uid: no fallback either way.
	p, err := resolve(int32(os.Getuid()), tok.GetToken())
	if err != nil || p.GetPrincipalId() != "user:alice" || p.GetTokenId() == "" {
		t.Fatalf("paired token: %v %v", p, err)
	}
	_, err = resolve(int32(os.Getuid()), tok.GetToken()+"x")
	if st, reason, _ := refusal(t, err); st.Code() != codes.Unauthenticated || reason != rpcerr.ReasonAuthRequired {
		t.Fatalf("unpaired token: %v", err)
	}
	// A restarted service still knows the token; a revoked one is refused.
	again, err := New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := again.current().tokens[tokenID(tok.GetToken())]; !ok {
		t.Fatal("token lost on restart")
	}
	if r, err := e.rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: "alice"}); err != nil || r.GetRevoked() != 1 {
		t.Fatalf("revoke: %v %v", r, err)
	}
	if _, err := resolve(int32(os.Getuid()), tok.GetToken()); wire(err).Code != jsonrpc.CodeAuthRequired {
		t.Fatalf("revoked token: %v", err)
	}
}

func TestAuthorize(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	e.mustSet(
		kv{"agents.work.model", "m"},
		kv{"permission_profiles.editor.permissions", []any{"Config:Update", "files:create"}},
		kv{"permission_profiles.editor.config_paths", []any{"agents.*.model"}},
		kv{"permission_profiles.editor.agents", []any{"work"}},
		kv{"permission_profiles.reader.permissions", []any{"Config:Read"}},
		kv{"permission_profiles.reader.config_paths", []any{"plugins"}},
		kv{"permission_profiles.root.permissions", []any{"admin"}},
		kv{"users.alice.uid", 1001},
		kv{"users.alice.permission_profiles", []any{"editor", "reader"}},
		kv{"users.bob.uid", 1002},
		kv{"users.bob.permission_profiles", []any{"root"}},
		kv{"users.carol.uid", 1003})
	alice, bob, carol := userPrincipal("alice", 1001), userPrincipal("bob", 1002), userPrincipal("carol", 1003)
	cases := []struct {
		who       *commonv1.Principal
		perm, res string
		allowed   bool
	}{
		{operator, "Config:Update", "rpc.max_frame_bytes", true},
		{operator, "anything:else", "", true},
		{alice, "Config:Update", "agents.work.model", true},
		{alice, "Config:Update", "agents.work.api_key", false},
		{alice, "Config:Read", "agents.default.model", true},
		{alice, "Config:Read", "plugins.limits.call_fuel", true},
		{alice, "Config:Update", "plugins.limits.call_fuel", false},
		{alice, "Config:Read", "users.alice.uid", false},
		{alice, "files:create", "s-1", true},
		{alice, "agent:use", "work", true},
		{alice, "agent:use", "default", false},
		{alice, "session:admin", "", false},
		{bob, "Config:Update", "users.bob.permission_profiles", true},
		{bob, "agent:use", "default", true},
		{carol, "Config:Read", "agents.default.model", false},
		{carol, "files:create", "", false},
		{userPrincipal("alice", 1002), "files:create", "", false}, // uid no longer alice's
		{userPrincipal("dave", 1004), "files:create", "", false},  // no such user
		{nil, "files:create", "", false},
		// standing: any principal whose binding stands, whatever it holds.
		{operator, "standing", "", true},
		{alice, "standing", "", true},
		{carol, "standing", "", true},
		{userPrincipal("alice", 1002), "standing", "", false},
		{userPrincipal("dave", 1004), "standing", "", false},
	}
	for _, c := range cases {
		resp, err := e.rpc.Authorize(ctx, &configv1.AuthorizeRequest{Principal: c.who, Permission: c.perm, Resource: c.res})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetAllowed() != c.allowed || (!c.allowed && resp.GetReason() == "") {
			t.Errorf("%s %s %q: allowed=%v (%s), want %v", c.who.GetPrincipalId(), c.perm, c.res, resp.GetAllowed(), resp.GetReason(), c.allowed)
		}
	}

	// Reads follow Config:Read: a scoped user's config/list shows only
	// what its paths cover, and config/get of another path is forbidden.
	list, err := e.rpc.List(ctx, &configv1.ListRequest{Principal: alice})
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range list.GetEntries() {
		if !(en.GetProp() == "agents.default.model" || en.GetProp() == "agents.work.model" || en.GetProp()[:8] == "plugins.") {
			t.Fatalf("alice lists %s", en.GetProp())
		}
	}
	if len(list.GetEntries()) < 3 {
		t.Fatalf("alice lists %v", list.GetEntries())
	}
	if _, err := e.rpc.Get(ctx, &configv1.GetRequest{Principal: alice, Prop: "users"}); wire(err).Code != jsonrpc.CodeForbidden {
		t.Fatalf("alice reads users: %v", err)
	}
}

// Deleting goes through the same validation: a profile still named by a
// user stays; a user, then its profile, can go; a leaf returns to its
// default; the default agent always exists.
func TestDelete(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	scopedUser(e)
	e.mustSet(kv{"rpc.max_local_connections", 8}, kv{"agents.default.model", "x"})
	del := func(prop string) error {
		_, err := e.rpc.Delete(ctx, &configv1.DeleteRequest{Principal: operator, Prop: prop})
		return err
	}
	if err := del("permission_profiles.editor"); wire(err).Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("deleting a profile in use: %v", err)
	}
	if err := del("users.alice"); err != nil {
		t.Fatal(err)
	}
	if err := del("permission_profiles.editor"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.get("users.alice"); wire(err).Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("users.alice after delete: %v", err)
	}
	if err := del("rpc.max_local_connections"); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.get("rpc.max_local_connections"); v != 512.0 {
		t.Fatalf("back to default: %v", v)
	}
	if err := del("agents.default"); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.get("agents.default.provider"); v != "scripted" {
		t.Fatalf("default agent after delete: %v", v)
	}
	if err := del("users.nobody"); wire(err).Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("deleting what is not set: %v", err)
	}
	if err := del("rpc"); wire(err).Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("deleting a group: %v", err)
	}
}

// A "*" segment is the schema's stand-in for an entry's name, not a name:
// written, it made entries named "*" (agents.*, users.*, ...) that
// config/delete, taking only valid names, could never remove. Such a
// write is refused; an entry an older version stored so can be deleted.
func TestEntryNamedStarRefusedAndDeletable(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	for _, s := range []kv{
		{"agents.*.model", "x"}, {"users.*.uid", 5555}, {"permission_profiles.*.permissions", []any{"admin"}},
		{"plugins.entries.*.config", map[string]any{}},
	} {
		_, err := e.setMany(operator, s)
		if w := wire(err); w.Code != jsonrpc.CodeInvalidParams || !strings.Contains(w.Message, "stands for an entry's name") {
			t.Errorf("set %s: %v, want -32602", s.prop, err)
		}
	}
	if _, newest := e.storedRevisions(); newest != 0 {
		t.Fatalf("a refused write committed revision %d", newest)
	}

	// An older version's document, with an agent named "*".
	if _, err := e.opts.DB.Exec(ctx, "INSERT INTO revisions (revision, document, committed_by) VALUES (1, $1, 'old')",
		[]byte(`{"agents":{"*":{"model":"x"}}}`)); err != nil {
		t.Fatal(err)
	}
	srv, err := New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Delete(ctx, &configv1.DeleteRequest{Principal: operator, Prop: "agents.*"}); err != nil {
		t.Fatalf("deleting the entry named *: %v", err)
	}
	if _, left := configschema.Get(srv.current().stored, "agents.*"); left {
		t.Fatalf("stored after the delete: %v", srv.current().stored)
	}
}

// Removing a user unpairs its tokens: a user created later under the
// same name (another person, other profiles) is not reachable with the
// tokens of the one removed. A token an older version left paired with a
// removed name is unpaired when the name is created again.
func TestRemovedUsersTokensStayUnpaired(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	scopedUser(e) // alice
	resolve := func(token string) error {
		_, err := e.rpc.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: 4242, PeerPid: 7, AuthToken: token})
		return err
	}
	tok, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.rpc.Delete(ctx, &configv1.DeleteRequest{Principal: operator, Prop: "users.alice"}); err != nil {
		t.Fatal(err)
	}
	e.mustSet(kv{"users.alice.permission_profiles", []any{"editor"}})
	if err := resolve(tok.GetToken()); wire(err).Code != jsonrpc.CodeAuthRequired {
		t.Fatalf("token of the removed alice, with a new alice: %v", err)
	}
	var live int
	if err := e.opts.DB.QueryRow(ctx, "SELECT count(*) FROM tokens WHERE revoked_at IS NULL").Scan(&live); err != nil || live != 0 {
		t.Fatalf("tokens still paired in the database: %d (%v)", live, err)
	}

	// Left paired by an older version with a name that no longer exists.
	stale := TokenPrefix + "stale"
	if _, err := e.opts.DB.Exec(ctx, "INSERT INTO tokens (token_hash, username) VALUES ($1, 'bob')", tokenID(stale)); err != nil {
		t.Fatal(err)
	}
	srv, err := New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Set(ctx, &configv1.SetRequest{Principal: operator, Prop: "users.bob.permission_profiles",
		Value: structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("editor")}})}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: 4242, AuthToken: stale}); wire(err).Code != jsonrpc.CodeAuthRequired {
		t.Fatalf("stale token of bob, with a new bob: %v", err)
	}
}

// A principal whose binding no longer stands (its token revoked, its
// user removed) is refused, naming why, on every config call: config/get
// of the whole document and config/list answered an empty success, as if
// the user could read nothing, where config/get of one property said why.
func TestRevokedPrincipalRefusedWholeDocumentAndList(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	alice := scopedUser(e)
	tok, err := e.rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	byToken := &commonv1.Principal{PrincipalId: "user:alice", User: "alice", TokenId: tokenID(tok.GetToken()), PeerUid: 4242}
	for _, pr := range []*commonv1.Principal{alice, byToken} {
		if _, err := e.rpc.List(ctx, &configv1.ListRequest{Principal: pr}); err != nil {
			t.Fatalf("list while the binding stands: %v", err)
		}
	}
	if _, err := e.rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: "alice"}); err != nil {
		t.Fatal(err)
	}
	e.mustSet(kv{"users.alice.uid", 1002})
	for _, pr := range []*commonv1.Principal{alice, byToken} {
		_, err := e.rpc.Get(ctx, &configv1.GetRequest{Principal: pr})
		if w := wire(err); w.Code != jsonrpc.CodeForbidden || !strings.Contains(w.Message, "alice") {
			t.Errorf("config/get of the whole document by %v: %v, want -32012", pr, err)
		}
		_, err = e.rpc.List(ctx, &configv1.ListRequest{Principal: pr})
		if w := wire(err); w.Code != jsonrpc.CodeForbidden || !strings.Contains(w.Message, "alice") {
			t.Errorf("config/list by %v: %v, want -32012", pr, err)
		}
	}
	if _, err := e.rpc.List(ctx, &configv1.ListRequest{Principal: operator}); err != nil {
		t.Fatalf("operator's list: %v", err)
	}
}

// A uid is 32 bits without a sign (the schema takes users.<name>.uid up
// to 4294967295); the peer's travels as an int32, so one past 2^31-1
// arrived negative and matched no user: a user configured with uid
// 3000000000 could never connect. It binds now, and stands; -1, the
// gateway's "no credentials", binds no user, not even one whose uid is
// 4294967295.
func TestUIDsPast2To31Bind(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	const big = 3000000000
	e.mustSet(kv{"permission_profiles.reader.permissions", []any{"Config:Read"}},
		kv{"permission_profiles.reader.config_paths", []any{"agents"}},
		kv{"users.big.uid", big}, kv{"users.big.permission_profiles", []any{"reader"}},
		kv{"users.max.uid", 4294967295}, kv{"users.max.permission_profiles", []any{"reader"}})
	var u uint32 = big
	wrapped := int32(u) // what SO_PEERCRED's uid becomes as an int32: -1294967296
	resp, err := e.rpc.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: wrapped, PeerPid: 7})
	if err != nil || resp.GetPrincipal().GetPrincipalId() != "user:big" {
		t.Fatalf("uid %d: %v %v", big, resp.GetPrincipal(), err)
	}
	if _, err := e.rpc.Get(ctx, &configv1.GetRequest{Principal: resp.GetPrincipal(), Prop: "agents.default.model"}); err != nil {
		t.Fatalf("uid %d reading: %v", big, err)
	}
	if resp, err := e.rpc.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{PeerUid: -1, PeerPid: 7}); err == nil {
		t.Fatalf("a peer without credentials bound to %v", resp.GetPrincipal())
	}
}
