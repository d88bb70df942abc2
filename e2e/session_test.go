package e2e_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// update is one session/update's params.
type update struct {
	SessionID  string          `json:"session_id"`
	SessionIDc string          `json:"sessionId"`
	Type       string          `json:"type"`
	Text       string          `json:"text"`
	ToolCallID string          `json:"tool_call_id"`
	Name       string          `json:"name"`
	RawInput   json.RawMessage `json:"raw_input"`
	RawOutput  string          `json:"raw_output"`
	RequestID  string          `json:"request_id"`
	ToolName   string          `json:"tool_name"`
	Timeout    int             `json:"timeout_secs"`
	Outcome    string          `json:"outcome"`
	Content    string          `json:"content"`
	Gen        *int64          `json:"client_turn_generation"`
}

// conv is a client that keeps every frame it reads, for tests that watch a
// turn's stream.
type conv struct {
	t *testing.T
	c *e2e.Client
	n int
	// s, when set, is the stack: a read that fails says what the
	// gateway logged of closing connections.
	s *e2e.Stack
}

func newConv(t *testing.T, s *e2e.Stack, caps map[string]any) *conv {
	t.Helper()
	return newConvOn(t, s, s.Dial(t), caps)
}

// newConvOn is newConv on a client already dialled (s.DialReading's).
func newConvOn(t *testing.T, s *e2e.Stack, c *e2e.Client, caps map[string]any) *conv {
	t.Helper()
	params := map[string]any{"protocol_version": 1}
	if caps != nil {
		params["client_capabilities"] = caps
	}
	if _, err := c.Call("initialize", params); err != nil {
		t.Fatal(err)
	}
	return &conv{t: t, c: c, n: 100, s: s}
}

// userToken creates a token for user with the CLI and returns it.
func userToken(t *testing.T, s *e2e.Stack, user string) string {
	t.Helper()
	out, err := clawmesh(t, s, "token", "create", "--user", user)
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	return strings.TrimSpace(out)
}

// aliceChats lets the user alice use the default agent (and nothing else)
// and returns a token of hers.
func aliceChats(t *testing.T, s *e2e.Stack, op *conv) string {
	t.Helper()
	op.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "permission_profiles.chat.agents", "value": []string{"default"}},
		{"prop": "users.alice.permission_profiles", "value": []string{"chat"}},
	}})
	return userToken(t, s, "alice")
}

// send writes a request and returns its id.
func (v *conv) send(method string, params any) string {
	v.t.Helper()
	v.n++
	id := fmt.Sprintf(`"r%d"`, v.n)
	if params == nil {
		params = map[string]any{}
	}
	raw, _ := json.Marshal(params)
	if err := v.c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":%q,"params":%s}`, id, method, raw)); err != nil {
		v.t.Fatal(err)
	}
	return id
}

// next reads the next frame.
func (v *conv) next() *e2e.Frame {
	v.t.Helper()
	f, line, err := v.c.Read(30 * time.Second)
	if err != nil {
		if len(line) > 512 {
			line = append(line[:512:512], "..."...)
		}
		v.t.Fatalf("read: %v (%q)%s", err, line, v.closings())
	}
	return f
}

// closings is what the gateway logged of the connections it closed, for
// a read that failed: a closed connection reads EOF whatever the cause.
func (v *conv) closings() string {
	if v.s == nil {
		return ""
	}
	var out []string
	for _, l := range strings.Split(readLog(v.t, v.s, "gateway"), "\n") {
		if strings.Contains(l, "closing connection") || strings.Contains(l, "write stall") || strings.Contains(l, "nats") {
			out = append(out, l)
		}
	}
	if len(out) > 8 {
		out = out[len(out)-8:]
	}
	return "\nthe gateway's log of closings and its bus link:\n" + strings.Join(out, "\n")
}

func (v *conv) upd(f *e2e.Frame) (update, bool) {
	if f.Method != "session/update" {
		return update{}, false
	}
	var u update
	if err := json.Unmarshal(f.Params, &u); err != nil {
		v.t.Fatalf("bad update %s: %v", f.Params, err)
	}
	return u, true
}

// until reads frames until the response to id, returning the updates seen
// on the way, and the response.
func (v *conv) until(id string) ([]update, *e2e.Frame) {
	v.t.Helper()
	var ups []update
	for {
		f := v.next()
		if u, ok := v.upd(f); ok {
			ups = append(ups, u)
			continue
		}
		if f.Method == "" && string(f.ID) == id {
			return ups, f
		}
		if f.Method != "" {
			continue // requests from the server are handled by the tests that expect them
		}
		v.t.Fatalf("unexpected frame while waiting for %s: id %s", id, f.ID)
	}
}

func (v *conv) call(method string, params any) json.RawMessage {
	v.t.Helper()
	_, f := v.until(v.send(method, params))
	if f.Error != nil {
		v.t.Fatalf("%s: %v", method, f.Error)
	}
	return f.Result
}

func (v *conv) newSession(alias string) string {
	v.t.Helper()
	var r struct {
		SessionID    string `json:"session_id"`
		WorkspaceDir string `json:"workspace_dir"`
	}
	params := map[string]any{}
	if alias != "" {
		params["agent_alias"] = alias
	}
	if err := json.Unmarshal(v.call("session/new", params), &r); err != nil || r.SessionID == "" {
		v.t.Fatalf("session/new: %v", err)
	}
	return r.SessionID
}

func countType(ups []update, typ string) int {
	n := 0
	for _, u := range ups {
		if u.Type == typ {
			n++
		}
	}
	return n
}

func TestSessionStreamingTurn(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	id := v.newSession("")

	prompt := v.send("session/prompt", map[string]any{
		"session_id": id, "prompt": "/say hello world\n/sleep 1500\n/say again", "client_turn_generation": 7,
	})
	// The first chunk arrives while the turn still runs: session/state on
	// the same connection answers running before the turn ends, so chunks
	// stream as they come, not after the provider finished.
	first := v.next()
	u, ok := v.upd(first)
	if !ok || u.Type != "agent_message_chunk" || u.Text != "hello " || u.SessionIDc != id {
		t.Fatalf("first frame %+v", first)
	}
	stateID := v.send("session/state", map[string]any{"session_id": id})
	ups, resp := v.until(stateID)
	var st struct {
		State string `json:"state"`
	}
	json.Unmarshal(resp.Result, &st)
	if st.State != "running" {
		t.Fatalf("state while the turn sleeps: %s", resp.Result)
	}
	// A long prompt never blocks status on the same connection. Updates
	// read meanwhile are kept: the turn streams on.
	during, f := v.until(v.send("status", nil))
	if f.Error != nil {
		t.Fatal(f.Error)
	}
	more, resp := v.until(prompt)
	ups = append(append(append([]update{u}, ups...), during...), more...)
	var text strings.Builder
	for _, u := range ups {
		if u.Type == "agent_message_chunk" {
			text.WriteString(u.Text)
		}
	}
	if text.String() != "hello world\nagain" {
		t.Fatalf("chunks %q", text.String())
	}
	if n := countType(ups, "turn_complete"); n != 1 {
		t.Fatalf("%d turn_complete", n)
	}
	last := ups[len(ups)-1]
	if last.Type != "turn_complete" || last.Outcome != "completed" || last.Content != "hello world\nagain" || last.Gen == nil || *last.Gen != 7 {
		t.Fatalf("turn_complete %+v (it must come before the prompt's response)", last)
	}
	var pr struct {
		SessionID, Outcome, Content string
	}
	json.Unmarshal(resp.Result, &pr)
	if pr.Outcome != "completed" || pr.Content != "hello world\nagain" {
		t.Fatalf("prompt result %s", resp.Result)
	}

	// /fail ends the turn failed, once.
	ups, resp = v.until(v.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say partial\n/fail broken tool chain"}))
	if n := countType(ups, "turn_complete"); n != 1 || ups[len(ups)-1].Outcome != "failed" {
		t.Fatalf("fail turn updates %+v", ups)
	}
	json.Unmarshal(resp.Result, &pr)
	if pr.Outcome != "failed" {
		t.Fatalf("fail turn result %s", resp.Result)
	}

	// The transcript is kept: user and agent messages, never renumbered.
	var msgs struct {
		Messages []struct {
			Index   int
			Role    string
			Content string
		}
		Total int
	}
	json.Unmarshal(v.call("session/messages", map[string]any{"session_id": id}), &msgs)
	if msgs.Total < 3 || len(msgs.Messages) != msgs.Total || msgs.Messages[0].Index != 0 || msgs.Messages[0].Role != "user" {
		t.Fatalf("messages %+v", msgs)
	}
}

func TestSessionRefusals(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	_, f := v.until(v.send("session/prompt", map[string]any{"session_id": "no-such-session", "prompt": "hi"}))
	if f.Error == nil || f.Error.Code != -32000 {
		t.Fatalf("unknown session: %+v", f.Error)
	}
	_, f = v.until(v.send("session/prompt", map[string]any{"prompt": "hi"}))
	if f.Error == nil || f.Error.Code != -32602 || !strings.Contains(f.Error.Message, "session_id") {
		t.Fatalf("missing session_id: %+v", f.Error)
	}
	id := v.newSession("")
	first := v.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say wait\n/sleep 1000\n/say done"})
	if u, ok := v.upd(v.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("turn did not start")
	}
	_, f = v.until(v.send("session/prompt", map[string]any{"session_id": id, "prompt": "again"}))
	if f.Error == nil || f.Error.Code != -32002 {
		t.Fatalf("prompt during a running turn: %+v", f.Error)
	}
	if _, f := v.until(first); f.Error != nil {
		t.Fatal(f.Error)
	}
	// A prompt sent as a notification (older zerocode) still runs the turn.
	raw, _ := json.Marshal(map[string]any{"session_id": id, "prompt": "/say note"})
	v.c.Send(`{"jsonrpc":"2.0","method":"session/prompt","params":` + string(raw) + `}`)
	for {
		u, ok := v.upd(v.next())
		if ok && u.Type == "turn_complete" {
			if u.Content != "note" {
				t.Fatalf("notification turn %+v", u)
			}
			break
		}
	}
}

func TestSessionEchoToolTurn(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	id := v.newSession("")
	ups, resp := v.until(v.send("session/prompt", map[string]any{"session_id": id, "prompt": `/tool echo {"x":1}` + "\n/say after"}))
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	var call, result int = -1, -1
	for i, u := range ups {
		switch u.Type {
		case "tool_call":
			call = i
			if u.Name != "echo" || u.ToolCallID == "" || !strings.Contains(string(u.RawInput), `"x":1`) {
				t.Fatalf("tool_call %+v", u)
			}
		case "tool_result":
			result = i
			if u.ToolCallID != ups[call].ToolCallID || !strings.Contains(u.RawOutput, `"x":1`) {
				t.Fatalf("tool_result %+v", u)
			}
		}
	}
	if call < 0 || result < call {
		t.Fatalf("tool_call then tool_result expected: %+v", ups)
	}
}

// approvalTurn runs a turn whose echo call needs approval and answers the
// elicitation with reply (a JSON result, or "" to leave it unanswered).
func approvalTurn(t *testing.T, v *conv, id, reply string) []update {
	t.Helper()
	prompt := v.send("session/prompt", map[string]any{"session_id": id, "prompt": `/tool echo {"y":2}`})
	var ups []update
	for {
		f := v.next()
		if f.Method == "elicitation/create" {
			var p struct {
				SessionID string         `json:"sessionId"`
				Mode      string         `json:"mode"`
				Schema    map[string]any `json:"requestedSchema"`
			}
			json.Unmarshal(f.Params, &p)
			if p.SessionID != id || p.Mode != "form" || p.Schema["type"] != "object" {
				t.Fatalf("elicitation params %s", f.Params)
			}
			if !strings.HasPrefix(string(f.ID), `"zc-out-`) {
				t.Fatalf("outgoing id %s", f.ID)
			}
			if reply != "" {
				v.c.Send(`{"jsonrpc":"2.0","id":` + string(f.ID) + `,"result":` + reply + `}`)
			}
			continue
		}
		if u, ok := v.upd(f); ok {
			ups = append(ups, u)
			continue
		}
		if string(f.ID) == prompt {
			return ups
		}
	}
}

func toolResult(t *testing.T, ups []update) string {
	t.Helper()
	for _, u := range ups {
		if u.Type == "tool_result" {
			return u.RawOutput
		}
	}
	t.Fatalf("no tool_result in %+v", ups)
	return ""
}

func TestSessionApprovals(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{
		"--set", `agents.default.approval_required=["echo"]`,
		"--set", "agents.default.approval_timeout_secs=2",
	}})
	v := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	id := v.newSession("")

	ups := approvalTurn(t, v, id, `{"action":"accept","content":{"choice":"allow_once"}}`)
	if countType(ups, "approval_request") != 1 || !strings.Contains(toolResult(t, ups), `"y":2`) {
		t.Fatalf("accepted approval: %+v", ups)
	}
	ups = approvalTurn(t, v, id, `{"action":"decline"}`)
	if out := toolResult(t, ups); strings.Contains(out, `"y":2`) || !strings.Contains(strings.ToLower(out), "denied") {
		t.Fatalf("declined approval ran the tool: %q", out)
	}
	if ups[len(ups)-1].Type != "turn_complete" || ups[len(ups)-1].Outcome != "completed" {
		t.Fatalf("a denied call must not end the turn: %+v", ups[len(ups)-1])
	}
	ups = approvalTurn(t, v, id, `null`)
	if out := toolResult(t, ups); strings.Contains(out, `"y":2`) {
		t.Fatalf("a null result must reject: %q", out)
	}
	ups = approvalTurn(t, v, id, "")
	if out := toolResult(t, ups); strings.Contains(out, `"y":2`) || !strings.Contains(strings.ToLower(out), "denied") {
		t.Fatalf("an unanswered approval must be denied at its timeout: %q", out)
	}

	// Answered twice: session/approve from another connection of the owner
	// first, then the elicitation reply; only the first counts.
	other := newConv(t, s, nil)
	prompt := v.send("session/prompt", map[string]any{"session_id": id, "prompt": `/tool echo {"z":3}`})
	var ups2 []update
	for {
		f := v.next()
		if f.Method == "elicitation/create" {
			var req string
			for _, u := range ups2 {
				if u.Type == "approval_request" {
					req = u.RequestID
				}
			}
			var ack struct {
				Acknowledged bool `json:"acknowledged"`
			}
			json.Unmarshal(other.call("session/approve", map[string]any{"session_id": id, "request_id": req, "decision": "reject"}), &ack)
			if !ack.Acknowledged {
				t.Fatal("first decision not acknowledged")
			}
			v.c.Send(`{"jsonrpc":"2.0","id":` + string(f.ID) + `,"result":{"action":"accept","content":{"choice":"allow_once"}}}`)
			_, second := other.until(other.send("session/approve", map[string]any{"session_id": id, "request_id": req, "decision": "allow_once"}))
			var late struct {
				Acknowledged   bool   `json:"acknowledged"`
				AlreadyDecided bool   `json:"already_decided"`
				Decision       string `json:"decision"`
				DecidedBy      string `json:"decided_by"`
			}
			if second.Error != nil || json.Unmarshal(second.Result, &late) != nil || !late.AlreadyDecided || late.Acknowledged {
				t.Fatalf("a later decision must be told it was already decided: %s %v", second.Result, second.Error)
			}
			// And which decision stands: the first, from session/approve.
			if late.Decision != "reject" || late.DecidedBy != "rpc" {
				t.Fatalf("a later decision must be told which one stands (reject, by rpc): %s", second.Result)
			}
			continue
		}
		if u, ok := v.upd(f); ok {
			ups2 = append(ups2, u)
			continue
		}
		if string(f.ID) == prompt {
			break
		}
	}
	if out := toolResult(t, ups2); strings.Contains(out, `"z":3`) {
		t.Fatalf("the second answer won: %q", out)
	}
}

func TestSessionFanOutAndStall(t *testing.T) {
	t.Parallel()
	// The third client never reads at all. The two readers read their
	// sockets ahead of what they parse (DialReading): parsing 20,000
	// updates under the race detector at a load of 40 left the socket
	// unread for longer than 2 s between two reads, and the gateway
	// rightly cut the prompting client as stalled (its log: "write
	// stalled" for conn 1 some 3 to 5 s after conn 3, in 6 of 7 runs).
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", "rpc.write_stall_timeout_ms=2000"}})
	a := newConvOn(t, s, s.DialReading(t), nil)
	id := a.newSession("")
	b := newConvOn(t, s, s.DialReading(t), nil)
	b.call("session/new", map[string]any{"session_id": id}) // attach by resuming
	stalled := newConv(t, s, nil)
	stalled.call("session/new", map[string]any{"session_id": id})

	// A long, chatty turn: the stalled client never reads and is cut; the
	// other two receive the whole stream.
	words := strings.Repeat("lorem ipsum dolor sit amet ", 4000)
	bDone := make(chan []update, 1)
	go func() {
		// b keeps reading while a prompts; it must see the whole stream.
		var ups []update
		for {
			f, _, err := b.c.Read(30 * time.Second)
			if err != nil {
				bDone <- ups
				return
			}
			if f.Method == "session/update" {
				// Not b.upd: its t.Fatal belongs to the test's goroutine.
				var u update
				if err := json.Unmarshal(f.Params, &u); err != nil {
					t.Errorf("bad update %s: %v", f.Params, err)
					bDone <- ups
					return
				}
				ups = append(ups, u)
				if u.Type == "turn_complete" {
					bDone <- ups
					return
				}
			}
		}
	}()
	prompt := a.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say " + words})
	aUps, resp := a.until(prompt)
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	bUps := testwait.Recv(t, bDone)
	if len(aUps) != len(bUps) || len(aUps) < 20000 {
		t.Fatalf("prompting client saw %d updates, attached client %d", len(aUps), len(bUps))
	}
	for i := range aUps {
		if aUps[i].Text != bUps[i].Text || aUps[i].Type != bUps[i].Type {
			t.Fatalf("update %d differs: %+v vs %+v", i, aUps[i], bUps[i])
		}
	}
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !strings.Contains(readLog(t, s, "gateway"), "write stalled") {
			return fmt.Errorf("the non-reading client was not cut")
		}
		return nil
	})
}

func TestSessionCancelAndClose(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	id := v.newSession("")

	// session/cancel from another connection ends the turn cancelled.
	prompt := v.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say start\n/sleep 20000\n/say never"})
	if u, ok := v.upd(v.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("turn did not start")
	}
	other := newConv(t, s, nil)
	other.call("session/cancel", map[string]any{"session_id": id})
	ups, resp := v.until(prompt)
	if resp.Error != nil || ups[len(ups)-1].Outcome != "cancelled" || countType(ups, "turn_complete") != 1 {
		t.Fatalf("cancel: %+v %v", ups, resp.Error)
	}

	// Closing the prompting connection mid-turn cancels the turn; the
	// session answers the next prompt.
	v.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say start\n/sleep 20000\n/say never"})
	if u, ok := v.upd(v.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("turn did not start")
	}
	v.c.Close()
	w := newConv(t, s, nil)
	deadline := time.Now().Add(15 * time.Second)
	for {
		var st struct{ State string }
		json.Unmarshal(w.call("session/state", map[string]any{"session_id": id}), &st)
		if st.State == "idle" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("turn still %s after its connection closed", st.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var pr struct{ Outcome, Content string }
	json.Unmarshal(w.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say back"}), &pr)
	if pr.Outcome != "completed" || pr.Content != "back" {
		t.Fatalf("next prompt %+v", pr)
	}
}

// SIGTERM to the gateway: it stops accepting, lets the in-flight prompt
// finish, then closes; the launcher brings a new gateway up on the socket.
func TestGatewayDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	id := v.newSession("")
	prompt := v.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say begin\n/sleep 1500\n/say end"})
	if u, ok := v.upd(v.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("turn did not start")
	}
	gw := s.PIDOf("gateway")
	if err := syscall.Kill(gw, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ups, resp := v.until(prompt)
	var pr struct{ Outcome, Content string }
	json.Unmarshal(resp.Result, &pr)
	if resp.Error != nil || pr.Outcome != "completed" || pr.Content != "begin\nend" || countType(ups, "turn_complete") != 1 {
		t.Fatalf("in-flight prompt during the drain: %s %v %+v", resp.Result, resp.Error, ups)
	}
	// Then the connection ends.
	if _, _, err := v.c.Read(15 * time.Second); err == nil {
		t.Fatal("connection still open after the drain")
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if p := s.PIDOf("gateway"); p == 0 || p == gw {
			return fmt.Errorf("gateway not restarted")
		}
		c, err := e2e.Dial(s.Socket)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Initialize()
		return err
	})
}

// Sessions, their transcript and tool calls live in PostgreSQL: they
// survive a restart of every process, the transcript never renumbered.
func TestSessionsSurviveAFullRestart(t *testing.T) {
	t.Parallel()
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir})
	v := newConv(t, s, nil)
	id := v.newSession("")
	v.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say first\n" + `/tool echo {"k":1}`})
	before := v.call("session/messages", map[string]any{"session_id": id})
	s.Stop()

	s2 := e2e.Start(t, e2e.Options{DataDir: dir})
	w := newConv(t, s2, nil)
	var list struct {
		Sessions []struct {
			SessionID string `json:"session_id"`
		} `json:"sessions"`
	}
	json.Unmarshal(w.call("session/list", map[string]any{}), &list)
	found := false
	for _, l := range list.Sessions {
		found = found || l.SessionID == id
	}
	if !found {
		t.Fatalf("session %s not listed after the restart: %+v", id, list)
	}
	after := w.call("session/messages", map[string]any{"session_id": id})
	if string(before) != string(after) {
		t.Fatalf("transcript changed across the restart:\nbefore %s\nafter  %s", before, after)
	}
	// The session goes on where it was: new rows follow the old ones.
	w.call("session/new", map[string]any{"session_id": id})
	var pr struct{ Outcome, Content string }
	json.Unmarshal(w.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say again"}), &pr)
	if pr.Outcome != "completed" || pr.Content != "again" {
		t.Fatalf("prompt after the restart: %+v", pr)
	}
	var msgs struct {
		Messages []struct{ Index int }
		Total    int
	}
	json.Unmarshal(w.call("session/messages", map[string]any{"session_id": id}), &msgs)
	for i, m := range msgs.Messages {
		if m.Index != i {
			t.Fatalf("transcript renumbered: %+v", msgs.Messages)
		}
	}
}

// A token-bound user: sessions are its own (another's session is
// SESSION_NOT_OWNED, -32003), and agents need agent:use (FORBIDDEN,
// -32012), checked again on every turn so a revocation stops the next one.
func TestSessionOwnershipAndAgentGrants(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := newConv(t, s, nil)
	opSession := op.newSession("")
	op.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "permission_profiles.chat.agents", "value": []string{"default"}},
		{"prop": "permission_profiles.none.permissions", "value": []string{"Config:Read"}},
		{"prop": "users.alice.permission_profiles", "value": []string{"chat"}},
		{"prop": "users.bob.permission_profiles", "value": []string{"none"}},
	}})
	dial := func(user string) *conv {
		c := s.Dial(t)
		if _, err := c.Call("initialize", map[string]any{"protocol_version": 1, "auth_token": userToken(t, s, user)}); err != nil {
			t.Fatal(err)
		}
		return &conv{t: t, c: c, n: 100}
	}
	alice, bob := dial("alice"), dial("bob")

	mine := alice.newSession("")
	var pr struct{ Outcome, Content string }
	json.Unmarshal(alice.call("session/prompt", map[string]any{"session_id": mine, "prompt": "/say hers"}), &pr)
	if pr.Content != "hers" {
		t.Fatalf("alice's own turn: %+v", pr)
	}
	for _, method := range []string{"session/prompt", "session/state", "session/messages", "session/cancel"} {
		_, f := alice.until(alice.send(method, map[string]any{"session_id": opSession, "prompt": "/say not yours"}))
		if f.Error == nil || f.Error.Code != -32003 {
			t.Fatalf("%s on the operator's session: %+v", method, f.Error)
		}
	}
	_, f := bob.until(bob.send("session/new", map[string]any{}))
	if f.Error == nil || f.Error.Code != -32012 {
		t.Fatalf("session/new without agent:use: %+v", f.Error)
	}
	// The operator may act on any session.
	op.call("session/state", map[string]any{"session_id": mine})

	// Revoked: alice's next turn is refused.
	op.call("config/set", map[string]any{"prop": "permission_profiles.chat.agents", "value": []string{}})
	_, f = alice.until(alice.send("session/prompt", map[string]any{"session_id": mine, "prompt": "/say again"}))
	if f.Error == nil || f.Error.Code != -32012 {
		t.Fatalf("a turn after the grant was revoked: %+v", f.Error)
	}
}

// Agent settings follow the live config: a config/set on the running
// stack reaches the session service (over NATS) with no restart.
func TestSessionFollowsLiveAgentConfig(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	id := v.newSession("")
	if ups := approvalTurn(t, v, id, ""); countType(ups, "approval_request") != 0 {
		t.Fatalf("approval asked before it was required: %+v", ups)
	}
	v.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "agents.default.approval_required", "value": []string{"echo"}},
		{"prop": "agents.default.approval_timeout_secs", "value": 30},
	}})
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		ups := approvalTurn(t, v, id, `{"action":"accept","content":{"choice":"allow_once"}}`)
		if countType(ups, "approval_request") != 1 {
			return fmt.Errorf("no approval_request yet")
		}
		return nil
	})
}
