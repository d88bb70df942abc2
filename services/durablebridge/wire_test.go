package durablebridge

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// The handler's own rules, in WIRE.md's order, over the private socket.
func TestWireRefusals(t *testing.T) {
	w := newWireBridge(t, false)
	c := w.collie(t)
	ctx := context.Background()

	// Before ready: hello says so, every other route is 503 starting,
	// but a missing version or an unknown route is refused first.
	h, err := c.SayHello(ctx)
	if err != nil || h.Ready || h.Epoch != testEpoch || h.Host.Name != "test host" || !h.Caps["starters"] {
		t.Fatalf("hello before ready: %+v %v", h, err)
	}
	want(t, raw(t, c, http.MethodGet, "/snapshot", v1(), nil), http.StatusServiceUnavailable, codeStarting)
	want(t, raw(t, c, http.MethodGet, "/snapshot", http.Header{"X-Collie-Session": nil}, nil), http.StatusBadRequest, codeVersionRequired)
	want(t, raw(t, c, http.MethodGet, "/nowhere", v1(), nil), http.StatusNotFound, codeNotFound)
	want(t, raw(t, c, http.MethodPost, "/rename", v1(), []byte(strings.Repeat(" ", maxBody+1))), http.StatusServiceUnavailable, codeStarting)
	w.b.layout.SetReady()

	// The version: required after hello, and a version the agent does not
	// speak is refused with both ranges, on hello (the informative hello)
	// and on any route.
	want(t, raw(t, c, http.MethodGet, "/nowhere", http.Header{"X-Collie-Session": nil}, nil), http.StatusBadRequest, codeVersionRequired)
	want(t, raw(t, c, http.MethodGet, "/snapshot", http.Header{"X-Collie-Session": {"one"}}, nil), http.StatusBadRequest, codeVersionRequired)
	for _, path := range []string{"/hello", "/snapshot"} {
		r := raw(t, c, http.MethodGet, path, http.Header{"X-Collie-Session": {"2"}}, nil)
		want(t, r, http.StatusConflict, codeIncompatible)
		var ref wireRefusal
		if err := r.JSON(&ref); err != nil || ref.Refusal.Agent != (versionRange{1, 1}) || ref.Refusal.Collie != (versionRange{2, 2}) {
			t.Fatalf("informative hello %s", r)
		}
	}

	// A route is a method and a path.
	for _, rq := range [][2]string{{http.MethodPost, "/snapshot"}, {http.MethodGet, "/pane/p1/answer"}, {http.MethodGet, "/snapshot/"},
		{http.MethodGet, "/session/v1/snapshot"}, {http.MethodDelete, "/rename"}, {http.MethodGet, "/pane/p1/events/x"}} {
		want(t, raw(t, c, rq[0], rq[1], v1(), nil), http.StatusNotFound, codeNotFound)
	}

	// Bodies: at most 64 KiB, checked before the ids; ids are checked
	// after percent-decoding, before the body's shape.
	big := []byte(`{"requestId":"r1","pad":"` + strings.Repeat("x", maxBody) + `"}`)
	want(t, raw(t, c, http.MethodPost, "/pane/bad%2Fid/send", v1(), big), http.StatusRequestEntityTooLarge, codeTooLarge)
	for _, id := range []string{"a%2Fb", "a%3Fb", "a%23b", "a%20b", "a%09b", "%E2%80%8Bzw", strings.Repeat("x", 129)} {
		want(t, raw(t, c, http.MethodGet, "/pane/"+id+"/events", v1(), nil), http.StatusBadRequest, codeBadID)
	}
	want(t, raw(t, c, http.MethodGet, "/pane//events", v1(), nil), http.StatusBadRequest, codeBadID)
	// A decoded id that is valid is looked up as itself.
	want(t, raw(t, c, http.MethodGet, "/pane/caf%C3%A9/events", v1(), nil), http.StatusNotFound, codeNoSuchPane)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{"requestId":"has space","askId":1}`)), http.StatusBadRequest, codeBadID)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{"requestId":"r1","askId":"a b"}`)), http.StatusBadRequest, codeBadID)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{"requestId":7}`)), http.StatusBadRequest, codeBadID)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{"requestId":"r1","askId":"a1"}`)), http.StatusBadRequest, codeBadRequest)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`[1]`)), http.StatusBadRequest, codeBadRequest)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{} {}`)), http.StatusBadRequest, codeBadRequest)
	// An empty POST body is {}: it lacks its requestId.
	r := raw(t, c, http.MethodPost, "/close", v1(), nil)
	want(t, r, http.StatusBadRequest, codeBadRequest)
	if !strings.Contains(r.String(), "requestId") {
		t.Fatalf("empty body: %s", r)
	}
	want(t, raw(t, c, http.MethodPost, "/close", v1(), []byte(`{"requestId":"r1","target":{"pane":"a","tab":"b"}}`)), http.StatusBadRequest, codeBadRequest)
	want(t, raw(t, c, http.MethodGet, "/pane/p1/events?after=-1", v1(), nil), http.StatusBadRequest, codeBadRequest)
	want(t, raw(t, c, http.MethodGet, "/pane/nobody/events?after=0", v1(), nil), http.StatusNotFound, codeNoSuchPane)

	// Every error is JSON with a code.
	r = raw(t, c, http.MethodGet, "/nowhere", v1(), nil)
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error content type %q", ct)
	}
}

// The snapshot's ETag is "<epoch>-<rev>"; a matching If-None-Match, weak
// or strong or in a list, is a 304; rev rises with every visible change.
func TestSnapshotETag(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	c := w.collie(t)
	ctx := context.Background()
	if _, err := c.SayHello(ctx); err != nil {
		t.Fatal(err)
	}
	changed, r, err := c.Poll(ctx)
	if err != nil || !changed {
		t.Fatalf("first poll: %v %v", r, err)
	}
	tag := r.Header.Get("ETag")
	if !strings.HasPrefix(tag, `"`+testEpoch+"-") || c.Snap.Epoch != testEpoch || tag != `"`+testEpoch+"-"+itoa(c.Snap.Rev)+`"` {
		t.Fatalf("etag %s, snapshot rev %d", tag, c.Snap.Rev)
	}
	for _, inm := range []string{tag, "W/" + tag, `"other", ` + tag, "*"} {
		r := raw(t, c, http.MethodGet, "/snapshot", http.Header{"If-None-Match": {inm}}, nil)
		if r.Status != http.StatusNotModified || r.Header.Get("ETag") != tag || len(r.Body) != 0 {
			t.Fatalf("If-None-Match %s: %s", inm, r)
		}
	}
	if r := raw(t, c, http.MethodGet, "/snapshot", http.Header{"If-None-Match": {`"` + testEpoch + `-0"`}}, nil); r.Status != http.StatusOK {
		t.Fatalf("an old tag: %s", r)
	}
	w.addPane("p1", "default", 1)
	changed, r, err = c.Poll(ctx)
	if err != nil || !changed || c.Snap.Pane("p1") == nil || r.Header.Get("ETag") == tag {
		t.Fatalf("poll after a change: %v %v", r, err)
	}
	if changed, _, err := c.Poll(ctx); err != nil || changed {
		t.Fatalf("poll without a change: %v %v", changed, err)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// A snapshot keeps to seed 004's limits; a permission ask is built from
// the tool's name and arguments, with allow_always only on the socket.
func TestSnapshotLimitsAndAsks(t *testing.T) {
	w := newWireBridge(t, false)
	l := w.b.layout
	for i := range 300 {
		w.addPane("p"+itoa(int64(1000+i)), "alias"+itoa(int64(i%3)), 0)
	}
	a := testAsk("p1299", "tc_1")
	a.args = json.RawMessage(`{"command":"rm -rf /tmp/x","n":2,"nested":{"a":[1,2]}}`)
	l.mutate("p1299", func(p *pane) bool { p.addAsk(a); return true })
	var starters []configclient.DurableStarter
	for i := range 60 {
		starters = append(starters, configclient.DurableStarter{ID: "s" + itoa(int64(100+i)), Title: "Starter\x07 " + itoa(int64(i))})
	}
	l.setStarters(starters)
	var doc wireSnapshot
	_, body := l.Snapshot(overSocket)
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	var got *wirePane
	for _, tab := range doc.Workspaces[0].Tabs {
		n += len(tab.Panes)
		for i := range tab.Panes {
			if tab.Panes[i].ID == "p1299" {
				got = &tab.Panes[i]
			}
		}
	}
	if n != maxPanes || len(doc.Workspaces) != 1 || len(doc.Workspaces[0].Tabs) != 3 {
		t.Fatalf("%d panes in %d tabs", n, len(doc.Workspaces[0].Tabs))
	}
	if len(doc.Starters) != maxStarters || doc.Starters[0].ID != "s100" || doc.Starters[0].Title != "Starter 0" {
		t.Fatalf("starters %d, first %+v", len(doc.Starters), doc.Starters[0])
	}
	if got == nil || got.State != stateWaiting || len(got.Asks) != 1 {
		t.Fatalf("the newest pane %+v", got)
	}
	k := got.Asks[0]
	if k.ID != askID("p1299", "tc_1") || len(k.ID) != 32 || k.Kind != "permission" || k.Revision != 1 || k.Title != "Run tool `echo`" ||
		k.Body != "command: rm -rf /tmp/x\nn: 2\nnested: {\"a\":[1,2]}" || k.Tool == nil || k.Tool.Name != "echo" || k.ExpiresAt == "" {
		t.Fatalf("ask %+v", k)
	}
	if len(k.Options) != 3 || k.Options[1].ID != optAllowAlways {
		t.Fatalf("socket options %+v", k.Options)
	}
	_, body = l.Snapshot(overToken)
	if strings.Contains(string(body), optAllowAlways) {
		t.Fatal("allow_always offered behind the token")
	}
}

// busySessions answers every StartTurn that a turn is running.
type busySessions struct{ sessionv1.SessionServiceClient }

func (busySessions) StartTurn(context.Context, *sessionv1.StartTurnRequest, ...grpc.CallOption) (*sessionv1.StartTurnResponse, error) {
	return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, "Session s-1 is busy")
}

// A text with a NUL (JSON's \u0000) sent to a busy pane is queued in the
// bridge's database, whose text column refuses NUL: it was answered 503
// "the session service did not answer" at every retry of the same id. It
// is queued now as the session service would store it, NUL as U+FFFD.
func TestSendQueuesATextWithNUL(t *testing.T) {
	w := newWireBridge(t, true)
	w.b.sessions = busySessions{}
	w.addPane("s-1", "main", 1)
	w.b.layout.SetReady()
	c := w.collie(t)
	r := raw(t, c, http.MethodPost, "/pane/s-1/send", v1(), []byte(`{"requestId":"r1","text":"hello\u0000world"}`))
	if r.Status != http.StatusOK || string(r.Body) != `{"ok":true,"queued":true}` {
		t.Fatalf("send: %d %s", r.Status, r.Body)
	}
	var body string
	if err := w.b.store.db.QueryRow(context.Background(), "SELECT body FROM queued_sends").Scan(&body); err != nil || body != "hello\uFFFDworld" {
		t.Fatalf("queued %q %v", body, err)
	}
}

// A POST body is one JSON object and nothing after it: a body with a
// stray closing brace or bracket after the object (`{...}}`, `{...}]`)
// was taken for the object alone and acted on, where a stray letter was
// refused.
func TestPostBodyWithTrailingBytes(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	c := w.collie(t)
	for _, tail := range []string{"}", "]", " }", "x", " {}", ","} {
		r := raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{"requestId":"r1"}`+tail))
		want(t, r, http.StatusBadRequest, codeBadRequest)
		if !strings.Contains(string(r.Body), "one JSON object") {
			t.Errorf("a body with %q after the object: %s", tail, r)
		}
	}
	for _, tail := range []string{"", "\n", " \r\n\t"} {
		r := raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), []byte(`{"requestId":"r1"}`+tail))
		if !strings.Contains(string(r.Body), "`askId` is required") {
			t.Errorf("a body with %q after the object: %s", tail, r)
		}
	}
}

// Revisions start at 1 (WIRE.md): an answer naming revision 0 or a
// negative one does not fit the route, a 400 bad-request, which is not
// remembered. It was taken for an older revision and answered 409 stale,
// telling the phone the ask had changed when it had not.
func TestAnswerRevisionBelowOne(t *testing.T) {
	w := newWireBridge(t, true)
	w.addPane("p1", "default", 0, testAsk("p1", "tc_1"))
	w.b.layout.SetReady()
	c := w.collie(t)
	askID := askID("p1", "tc_1")
	for _, rev := range []string{"0", "-1", "-9223372036854775808"} {
		body := []byte(`{"requestId":"r-` + rev + `","askId":"` + askID + `","revision":` + rev + `,"answer":{"option":"allow_once"}}`)
		r := raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), body)
		want(t, r, http.StatusBadRequest, codeBadRequest)
		if !strings.Contains(string(r.Body), "revision") {
			t.Errorf("revision %s: %s", rev, r)
		}
	}
	// A revision the ask does not have now (it changed since, or the
	// phone read a later one before a restart) is still stale.
	w.b.layout.mutate("p1", func(p *pane) bool { p.findAsk(askID).revision = 3; return true })
	body := []byte(`{"requestId":"r-2","askId":"` + askID + `","revision":2,"answer":{"option":"allow_once"}}`)
	want(t, raw(t, c, http.MethodPost, "/pane/p1/answer", v1(), body), http.StatusConflict, codeStale)
}
