package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	durablev1 "github.com/clawmesh/clawmesh/proto/clawmesh/durable/v1"
)

// The durable bridge's tests drive it as Collie does, over its private
// socket, against the real stack. The machine running them is shared and
// slow at times: Collie's own timeouts (1 s reads, 3 s posts) would fail
// the machine, not the bridge, so they are widened here.
var durableTimeouts = collietest.Timeouts{Read: 10 * time.Second, Post: 20 * time.Second, Starter: 60 * time.Second}

// approvalArgs make every echo call wait for an approval.
var approvalArgs = []string{"--set", `agents.default.approval_required=["echo"]`}

// phone is a Collie client of a stack's durable socket, with hello done
// and the bridge ready.
func phone(t testing.TB, s *e2e.Stack) *collietest.Client {
	t.Helper()
	c := collietest.Socket(filepath.Join(s.DataDir, "durable.sock"))
	c.Timeouts = durableTimeouts
	t.Cleanup(c.Close)
	waitReady(t, c)
	return c
}

// waitReady waits for c's hello to say the bridge is ready.
func waitReady(t testing.TB, c *collietest.Client) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		h, err := c.SayHello(context.Background())
		if err != nil {
			return err
		}
		if !h.Ready {
			return fmt.Errorf("not ready")
		}
		return nil
	})
}

// paneOfNewSession opens a session on a connection of its own to s,
// waits for c's snapshot to show its pane, and returns its id.
func paneOfNewSession(t *testing.T, s *e2e.Stack, c *collietest.Client) string {
	t.Helper()
	id := newConv(t, s, nil).newSession("")
	pollUntil(t, c, "the pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })
	return id
}

// pollUntil polls the snapshot until cond holds for it.
func pollUntil(t *testing.T, c *collietest.Client, what string, cond func(*collietest.Snapshot) bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		if _, _, err := c.Poll(context.Background()); err != nil {
			return err
		}
		if !cond(c.Snap) {
			return fmt.Errorf("snapshot without %s", what)
		}
		return nil
	})
}

// eventsUntil reads a pane's events until cond holds for its view.
func eventsUntil(t *testing.T, c *collietest.Client, pane, what string, cond func(collietest.PaneView) bool) collietest.PaneView {
	t.Helper()
	var v collietest.PaneView
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		if _, err := c.Events(context.Background(), pane); err != nil {
			return err
		}
		if v = c.View(pane); !cond(v) {
			return fmt.Errorf("pane view without %s: %+v", what, v)
		}
		return nil
	})
	return v
}

// openAsk waits until the pane shows one open ask and returns it.
func openAsk(t *testing.T, c *collietest.Client, pane string) collietest.Ask {
	t.Helper()
	pollUntil(t, c, "an open ask", func(s *collietest.Snapshot) bool {
		p := s.Pane(pane)
		return p != nil && p.State == "waiting" && len(p.Asks) == 1
	})
	return c.Snap.Pane(pane).Asks[0]
}

// post sends one intent and fails the test when it gets no answer.
func post(t *testing.T, c *collietest.Client, path, id string, body map[string]any) *collietest.Reply {
	t.Helper()
	r, err := c.Post(context.Background(), path, id, body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

func wantReply(t *testing.T, r *collietest.Reply, status int, code string) {
	t.Helper()
	if r.Status != status || r.Code() != code {
		t.Fatalf("want %d %q, got %s", status, code, r)
	}
}

// The whole story over the private socket: a session a socket client
// opened shows as a pane, the phone sends it a turn whose tool needs an
// approval, the ask appears, the phone answers, the tool runs and the
// pane's events show its result and the reply; the transcript is in the
// history afterwards.
func TestDurableStory(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: append(approvalArgs,
		"--set", "durable.starters.hello.title=Say hello",
		"--set", "durable.starters.hello.prompt=/say hello from a starter")})
	c := phone(t, s)
	ctx := context.Background()

	zc := newConv(t, s, nil)
	id := zc.newSession("")
	pollUntil(t, c, "the socket client's session", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })
	if p := c.Snap.Pane(id); p.State != "idle" || p.Turn != nil || len(c.Snap.Starters) != 1 || c.Snap.Starters[0].Title != "Say hello" {
		t.Fatalf("snapshot %+v", c.Snap)
	}
	if v, err := c.Events(ctx, id); err != nil || !v.Reset {
		t.Fatalf("first events read: %+v %v", v, err)
	}

	r := post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": `/tool echo {"x":1}` + "\n/say after", "turn": nil})
	if r.Status != http.StatusOK || string(r.Body) != `{"ok":true,"queued":false}` {
		t.Fatalf("send: %s", r)
	}
	a := openAsk(t, c, id)
	if a.Kind != "permission" || a.Revision != 1 || a.Title != "Run tool `echo`" || a.Body != "x: 1" || a.Tool == nil ||
		string(a.Tool.Arguments) != `{"x":1}` || a.ExpiresAt == "" || len(a.ID) != 32 {
		t.Fatalf("ask %+v", a)
	}
	opts := []string{}
	for _, o := range a.Options {
		opts = append(opts, o.ID)
	}
	if strings.Join(opts, ",") != "allow_once,allow_always,reject" {
		t.Fatalf("options on the socket %v", opts)
	}
	if p := c.Snap.Pane(id); p.Turn == nil || p.Turn.ID == "" {
		t.Fatalf("running pane without its turn: %+v", p)
	}
	eventsUntil(t, c, id, "the ask", func(v collietest.PaneView) bool { _, ok := v.Asks[a.ID]; return ok && v.State == "waiting" })

	answerID := collietest.NewRequestID()
	r, err := c.Answer(ctx, id, answerID, a, "allow_once")
	if err != nil || r.Status != http.StatusOK || string(r.Body) != `{"ok":true,"outcome":{"option":"allow_once"}}` {
		t.Fatalf("answer: %v %v", r, err)
	}
	v := eventsUntil(t, c, id, "the turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "after")
	})
	if tool := v.Text("tool"); !strings.Contains(tool, "echo") || !strings.Contains(tool, `completed: {"x":1}`) {
		t.Fatalf("tool item %q", tool)
	}
	if len(v.Closed) != 1 || v.Closed[0].AskID != a.ID || v.Closed[0].By != "phone" || string(v.Closed[0].Outcome) != `{"option":"allow_once"}` {
		t.Fatalf("ask-closed %+v", v.Closed)
	}
	if !strings.Contains(v.Text("user"), `/tool echo {"x":1}`) {
		t.Fatalf("the prompt is not shown: %+v", v.Items)
	}
	// The tap's retry is its first answer again; a later tap on the same
	// ask is told who decided; the id with another body is refused.
	r, _ = c.Answer(ctx, id, answerID, a, "allow_once")
	if r.Status != http.StatusOK || string(r.Body) != `{"replayed":true,"ok":true,"outcome":{"option":"allow_once"}}` {
		t.Fatalf("replayed answer: %s", r)
	}
	r, _ = c.Answer(ctx, id, collietest.NewRequestID(), a, "reject")
	wantReply(t, r, http.StatusConflict, "decided")
	if !strings.Contains(string(r.Body), `"by":"phone","outcome":{"option":"allow_once"}`) {
		t.Fatalf("decided: %s", r)
	}
	r, _ = c.Answer(ctx, id, answerID, a, "reject")
	wantReply(t, r, http.StatusConflict, "request-id-reused")

	// The socket client sees the same session: the tool ran once.
	var msgs struct {
		Messages []struct{ Role, Content string }
	}
	json.Unmarshal(zc.call("session/messages", map[string]any{"session_id": id}), &msgs)
	if len(msgs.Messages) != 3 || msgs.Messages[1].Content != `echo: {"x":1}` {
		t.Fatalf("transcript %+v", msgs.Messages)
	}

	// A text sent while a turn runs waits for the next turn; abort stops
	// the turn the phone saw; the waiting text then runs.
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/sleep 30000\n/say never"}), http.StatusOK, "")
	pollUntil(t, c, "the long turn", func(s *collietest.Snapshot) bool { p := s.Pane(id); return p != nil && p.Turn != nil })
	long := c.Snap.Pane(id).Turn.ID
	r = post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/say queued reply", "turn": long})
	if r.Status != http.StatusOK || string(r.Body) != `{"ok":true,"queued":true}` {
		t.Fatalf("send during a turn: %s", r)
	}
	wantReply(t, post(t, c, "/pane/"+id+"/abort", collietest.NewRequestID(), map[string]any{"turn": long}), http.StatusOK, "")
	v = eventsUntil(t, c, id, "the queued text's reply", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "queued reply")
	})
	if strings.Contains(v.Text("reply"), "never") {
		t.Fatalf("the stopped turn went on: %q", v.Text("reply"))
	}

	// The first decision wins across surfaces: the phone before the socket
	// client's elicitation reply, then the elicitation reply before the
	// phone.
	ze := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	eid := ze.newSession("")
	pollUntil(t, c, "the elicitation client's pane", func(s *collietest.Snapshot) bool { return s.Pane(eid) != nil })
	for _, phoneFirst := range []bool{true, false} {
		prompt := ze.send("session/prompt", map[string]any{"session_id": eid, "prompt": `/tool echo {"e":1}`})
		elicit := elicitationOf(t, ze)
		a := openAsk(t, c, eid)
		if phoneFirst {
			wantReply(t, must(c.Answer(ctx, eid, collietest.NewRequestID(), a, "allow_once")), http.StatusOK, "")
			ze.c.Send(`{"jsonrpc":"2.0","id":` + string(elicit) + `,"result":{"action":"decline"}}`)
		} else {
			ze.c.Send(`{"jsonrpc":"2.0","id":` + string(elicit) + `,"result":{"action":"decline"}}`)
		}
		ups, resp := ze.until(prompt)
		if resp.Error != nil {
			t.Fatal(resp.Error)
		}
		ran := strings.Contains(toolResult(t, ups), `"e":1`)
		if ran != phoneFirst {
			t.Fatalf("phone first %v: the tool ran %v (%q)", phoneFirst, ran, toolResult(t, ups))
		}
		if !phoneFirst {
			r := must(c.Answer(ctx, eid, collietest.NewRequestID(), a, "allow_once"))
			wantReply(t, r, http.StatusConflict, "decided")
			if !strings.Contains(string(r.Body), `"by":"program","outcome":{"option":"reject"}`) {
				t.Fatalf("the phone after the elicitation reply: %s", r)
			}
		}
	}

	// A starter opens a pane and runs its prompt; rename, close, history,
	// reopen.
	r = post(t, c, "/starter/hello", collietest.NewRequestID(), map[string]any{"text": "/say and more"})
	var started struct {
		OK   bool   `json:"ok"`
		Pane string `json:"pane"`
	}
	if r.Status != http.StatusOK || r.JSON(&started) != nil || !started.OK || started.Pane == "" {
		t.Fatalf("starter: %s", r)
	}
	eventsUntil(t, c, started.Pane, "the starter's reply", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "hello from a starter\nand more")
	})
	wantReply(t, post(t, c, "/starter/nope", collietest.NewRequestID(), nil), http.StatusNotFound, "no-such-starter")
	wantReply(t, post(t, c, "/rename", collietest.NewRequestID(), map[string]any{"target": map[string]any{"tab": "tab-default"}, "title": "Agents"}), http.StatusOK, "")
	wantReply(t, post(t, c, "/rename", collietest.NewRequestID(), map[string]any{"target": map[string]any{"workspace": "ws-main"}, "title": "Laptop"}), http.StatusOK, "")
	wantReply(t, post(t, c, "/rename", collietest.NewRequestID(), map[string]any{"target": map[string]any{"tab": "tab-ghost"}, "title": "x"}), http.StatusNotFound, "no-such-tab")
	pollUntil(t, c, "the new titles", func(s *collietest.Snapshot) bool {
		return s.Workspaces[0].Title == "Laptop" && len(s.Workspaces[0].Tabs) == 1 && s.Workspaces[0].Tabs[0].Title == "Agents"
	})
	wantReply(t, post(t, c, "/close", collietest.NewRequestID(), map[string]any{"target": map[string]any{"pane": id}}), http.StatusOK, "")
	pollUntil(t, c, "the closed pane gone", func(s *collietest.Snapshot) bool { return s.Pane(id) == nil && s.Pane(started.Pane) != nil })

	r, err = c.Conversations(ctx, "limit=1")
	var hist struct {
		Conversations []struct {
			ID, Title, Pane string
			Open            bool
		}
		Next *string
	}
	if err != nil || r.Status != http.StatusOK || r.JSON(&hist) != nil || len(hist.Conversations) != 1 || hist.Next == nil {
		t.Fatalf("conversations page 1: %v %v", r, err)
	}
	first := hist.Conversations[0]
	r, _ = c.Conversations(ctx, "limit=1&after="+*hist.Next)
	if r.JSON(&hist) != nil || len(hist.Conversations) != 1 {
		t.Fatalf("conversations page 2: %s", r)
	}
	byID := map[string]bool{first.ID: first.Open, hist.Conversations[0].ID: hist.Conversations[0].Open}
	if open, ok := byID[id]; !ok || open || len(byID) != 2 {
		t.Fatalf("history %v (closed %s)", byID, id)
	}
	if hist.Conversations[0].ID == id && hist.Conversations[0].Pane != "" {
		t.Fatalf("a closed conversation names a pane: %+v", hist.Conversations[0])
	}
	r, _ = c.Items(ctx, id, "limit=2")
	var items struct {
		Items []struct{ ID, Kind, Text string }
		Next  *string
	}
	if r.Status != http.StatusOK || r.JSON(&items) != nil || len(items.Items) != 2 || items.Items[0].Kind != "user" || items.Next == nil {
		t.Fatalf("items page 1: %s", r)
	}
	r, _ = c.Items(ctx, id, "after="+*items.Next)
	// The rest: the reply, the stopped turn's prompt (no reply), the
	// queued text and its reply.
	if r.JSON(&items) != nil || len(items.Items) != 4 || items.Items[0].Kind != "reply" || items.Items[0].Text != "after" ||
		items.Items[3].Text != "queued reply" || items.Next != nil {
		t.Fatalf("items page 2: %s", r)
	}
	wantReply(t, must(c.Items(ctx, "sess_nobody", "")), http.StatusNotFound, "no-such-conversation")
	r = post(t, c, "/reopen", collietest.NewRequestID(), map[string]any{"conversation": id})
	if r.Status != http.StatusOK || r.JSON(&started) != nil || started.Pane != id {
		t.Fatalf("reopen: %s", r)
	}
	pollUntil(t, c, "the reopened pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })
	wantReply(t, post(t, c, "/reopen", collietest.NewRequestID(), map[string]any{"conversation": "sess_nobody"}), http.StatusNotFound, "no-such-conversation")
}

// elicitationOf reads a socket client's frames up to the next
// elicitation/create and returns its id.
func elicitationOf(t *testing.T, v *conv) json.RawMessage {
	t.Helper()
	for {
		if f := v.next(); f.Method == "elicitation/create" {
			return f.ID
		}
	}
}

func must(r *collietest.Reply, err error) *collietest.Reply {
	if err != nil {
		panic(err)
	}
	return r
}

// durableState reads the bridge's state over its gRPC socket.
func durableState(t *testing.T, s *e2e.Stack) *durablev1.StateResponse {
	t.Helper()
	cc, err := grpcclient.Dial(filepath.Join(s.DataDir, "durable-bridge.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := durablev1.NewDurableServiceClient(cc).State(ctx, &durablev1.StateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

const durableToken = "test-token-0123456789-abcdefghijklmnop"

// Every status code of seed 004, each from the situation that calls for
// it; the token transport (plain http on loopback, as a local test may)
// says 401 and nothing else without the token.
func TestDurableStatusCodes(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: append(approvalArgs,
		"--set", "durable.listen_url=http://127.0.0.1:0",
		"--set", "durable.token="+durableToken,
		"--set", "agents.hasty.provider=scripted",
		"--set", `agents.hasty.approval_required=["echo"]`,
		"--set", "agents.hasty.approval_timeout_secs=1",
		"--set", "durable.starters.quick.agent=hasty",
		"--set", `durable.starters.quick.prompt=/tool echo {"q":1}`)})
	c := phone(t, s)
	ctx := context.Background()
	zc := newConv(t, s, nil)
	id := zc.newSession("")
	pollUntil(t, c, "the pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })

	// 304: a poll that finds nothing new; also with the weak tag.
	if changed, r, err := c.Poll(ctx); err != nil || changed || r.Status != http.StatusNotModified {
		t.Fatalf("poll without a change: %v %v %v", changed, r, err)
	}
	r, _ := c.Do(ctx, http.MethodGet, "/snapshot", http.Header{"If-None-Match": {"W/" + c.ETag}}, nil, durableTimeouts.Read, 0)
	if r.Status != http.StatusNotModified {
		t.Fatalf("weak tag: %s", r)
	}

	// 401 on the token transport, before anything else; the token opens it.
	st := durableState(t, s)
	if st.GetListenAddress() == "" || !st.GetReady() || st.GetEpoch() != c.Hello.Epoch {
		t.Fatalf("bridge state %v", st)
	}
	base := "http://" + st.GetListenAddress()
	for _, tok := range []string{"", "not-the-token-0123456789-abcdefghijkl"} {
		anon := collietest.URL(base, tok, nil)
		r, err := anon.Do(ctx, http.MethodGet, "/hello", nil, nil, durableTimeouts.Read, 0)
		if err != nil || r.Status != http.StatusUnauthorized || string(r.Body) != `{"code":"unauthorized"}` {
			t.Fatalf("token %q: %v %v", tok, r, err)
		}
	}
	remote := collietest.URL(base, durableToken, nil)
	remote.Timeouts = durableTimeouts
	if h, err := remote.SayHello(ctx); err != nil || h.Epoch != c.Hello.Epoch {
		t.Fatalf("hello with the token: %v %v", h, err)
	}

	// 404: a route that is none, and a pane that is none.
	wantReply(t, must(c.Do(ctx, http.MethodGet, "/panes", nil, nil, durableTimeouts.Read, 0)), http.StatusNotFound, "not-found")
	wantReply(t, must(c.Do(ctx, http.MethodPut, "/snapshot", nil, nil, durableTimeouts.Read, 0)), http.StatusNotFound, "not-found")
	wantReply(t, post(t, c, "/pane/sess_nobody/send", collietest.NewRequestID(), map[string]any{"text": "hi"}), http.StatusNotFound, "no-such-pane")

	// 409 incompatible: the informative hello with another version.
	r, _ = c.Do(ctx, http.MethodGet, "/hello", http.Header{"X-Collie-Session": {"2"}}, nil, durableTimeouts.Read, 0)
	wantReply(t, r, http.StatusConflict, "incompatible")
	if !strings.Contains(string(r.Body), `"refusal":{"agent":{"min":1,"max":1},"collie":{"min":2,"max":2}}`) {
		t.Fatalf("informative hello: %s", r)
	}

	// 413: a body over 64 KiB.
	big := `{"requestId":"big","text":"` + strings.Repeat("x", 64<<10) + `"}`
	wantReply(t, must(c.Do(ctx, http.MethodPost, "/pane/"+id+"/send", nil, []byte(big), durableTimeouts.Post, 0)), http.StatusRequestEntityTooLarge, "too-large")

	// 200 too-late: an ask the agent does not know.
	r = post(t, c, "/pane/"+id+"/answer", collietest.NewRequestID(), map[string]any{"askId": strings.Repeat("ab", 16), "revision": 1, "answer": map[string]any{"option": "allow_once"}})
	if r.Status != http.StatusOK || string(r.Body) != `{"ok":false,"code":"too-late"}` {
		t.Fatalf("unknown ask: %s", r)
	}

	// 409 turn-changed: a send or abort naming a turn that is not running.
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "hi", "turn": "turn_gone"}), http.StatusConflict, "turn-changed")
	wantReply(t, post(t, c, "/pane/"+id+"/abort", collietest.NewRequestID(), map[string]any{"turn": "turn_gone"}), http.StatusConflict, "turn-changed")

	// 409 stale: a tap on another revision of an open ask than the
	// current (an ask here never changes in place, so there is no older
	// one to name: the test names the next; revision 0 is no revision at
	// all, 400). 409 decided:
	// a tap after the socket client decided (program), with its outcome.
	// 409 request-id-reused: the same id with another body.
	reqID := collietest.NewRequestID()
	wantReply(t, post(t, c, "/pane/"+id+"/send", reqID, map[string]any{"text": `/tool echo {"s":1}`}), http.StatusOK, "")
	a := openAsk(t, c, id)
	other := a
	other.Revision = a.Revision + 1
	wantReply(t, must(c.Answer(ctx, id, collietest.NewRequestID(), other, "allow_once")), http.StatusConflict, "stale")
	other.Revision = 0
	wantReply(t, must(c.Answer(ctx, id, collietest.NewRequestID(), other, "allow_once")), http.StatusBadRequest, "bad-request")
	if a.Revision != 1 {
		t.Fatalf("a new ask's revision is %d", a.Revision)
	}
	// The phone over the token transport is not offered allow_always, and
	// may not pick it.
	if _, _, err := remote.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	for _, o := range remote.Snap.Pane(id).Asks[0].Options {
		if o.ID == "allow_always" {
			t.Fatal("allow_always offered behind the token")
		}
	}
	wantReply(t, must(remote.Answer(ctx, id, collietest.NewRequestID(), a, "allow_always")), http.StatusBadRequest, "bad-request")

	eventsUntil(t, c, id, "the ask", func(v collietest.PaneView) bool { _, ok := v.Asks[a.ID]; return ok })
	turnID := c.Snap.Pane(id).Turn.ID
	approve := zc.call("session/approve", map[string]any{"session_id": id, "request_id": approvalRequestOf(t, zc), "decision": "reject"})
	if !strings.Contains(string(approve), `"acknowledged":true`) {
		t.Fatalf("socket client's decision: %s", approve)
	}
	r = must(c.Answer(ctx, id, collietest.NewRequestID(), a, "allow_once"))
	wantReply(t, r, http.StatusConflict, "decided")
	if !strings.Contains(string(r.Body), `"by":"program","outcome":{"option":"reject"}`) {
		t.Fatalf("decided by the socket client: %s", r)
	}
	closed := eventsUntil(t, c, id, "the ask closed", func(v collietest.PaneView) bool { return len(v.Closed) == 1 && v.State == "idle" })
	if closed.Closed[0].By != "program" || !strings.Contains(closed.Text("tool"), "denied") {
		t.Fatalf("closed by the program: %+v %q", closed.Closed, closed.Text("tool"))
	}
	wantReply(t, post(t, c, "/pane/"+id+"/send", reqID, map[string]any{"text": "another text"}), http.StatusConflict, "request-id-reused")
	r = post(t, c, "/pane/"+id+"/send", reqID, map[string]any{"text": `/tool echo {"s":1}`})
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"replayed":true`) {
		t.Fatalf("replayed send: %s", r)
	}
	wantReply(t, post(t, c, "/pane/"+id+"/abort", collietest.NewRequestID(), map[string]any{"turn": turnID}), http.StatusConflict, "turn-changed")

	// An ask nobody answers times out (decidedBy timeout); a late tap is
	// told so.
	r = post(t, c, "/starter/quick", collietest.NewRequestID(), nil)
	var started struct{ Pane string }
	if r.Status != http.StatusOK || r.JSON(&started) != nil {
		t.Fatalf("starter: %s", r)
	}
	q := openAsk(t, c, started.Pane)
	tv := eventsUntil(t, c, started.Pane, "the timeout", func(v collietest.PaneView) bool { return len(v.Closed) == 1 && v.State == "idle" })
	if tv.Closed[0].By != "timeout" || tv.Closed[0].AskID != q.ID {
		t.Fatalf("timed out ask: %+v", tv.Closed)
	}
	r = must(c.Answer(ctx, started.Pane, collietest.NewRequestID(), q, "allow_once"))
	wantReply(t, r, http.StatusConflict, "decided")
	if !strings.Contains(string(r.Body), `"by":"timeout"`) {
		t.Fatalf("late tap after the timeout: %s", r)
	}
}

// approvalRequestOf reads a socket client's updates (it opened the
// session, so it follows it) up to the next approval request.
func approvalRequestOf(t *testing.T, v *conv) string {
	t.Helper()
	for {
		if u, ok := v.upd(v.next()); ok && u.Type == "approval_request" {
			return u.RequestID
		}
	}
}

// A conversation the phone opened from a starter is a session of the
// durable surface. Reopening it after the phone closed it named no
// surface (the session service then means its socket clients') and was
// refused as a conversation of another surface: 404
// no-such-conversation, for a conversation the history lists.
func TestDurableReopenAStartersConversation(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{
		"--set", "durable.starters.hello.title=Say hello",
		"--set", "durable.starters.hello.prompt=/say hello from a starter"}})
	c := phone(t, s)
	r := post(t, c, "/starter/hello", collietest.NewRequestID(), nil)
	var started struct {
		OK   bool   `json:"ok"`
		Pane string `json:"pane"`
	}
	if r.Status != http.StatusOK || r.JSON(&started) != nil || !started.OK || started.Pane == "" {
		t.Fatalf("starter: %s", r)
	}
	eventsUntil(t, c, started.Pane, "the starter's reply", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "hello from a starter")
	})
	wantReply(t, post(t, c, "/close", collietest.NewRequestID(), map[string]any{"target": map[string]any{"pane": started.Pane}}), http.StatusOK, "")
	pollUntil(t, c, "the closed pane gone", func(s *collietest.Snapshot) bool { return s.Pane(started.Pane) == nil })
	r = post(t, c, "/reopen", collietest.NewRequestID(), map[string]any{"conversation": started.Pane})
	var reopened struct {
		OK   bool   `json:"ok"`
		Pane string `json:"pane"`
	}
	if r.Status != http.StatusOK || r.JSON(&reopened) != nil || !reopened.OK || reopened.Pane != started.Pane {
		t.Fatalf("reopen the starter's conversation: %s", r)
	}
	pollUntil(t, c, "the reopened pane", func(s *collietest.Snapshot) bool { return s.Pane(started.Pane) != nil })
}
