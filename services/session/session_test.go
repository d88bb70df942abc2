package session

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// session/new, state, list, messages, ownership and the lifecycle methods
// against a real database.
func TestSessionLifecycle(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()

	resp, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "default", Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetSessionId()
	if resp.GetAgentAlias() != "default" || resp.GetMessageCount() != 0 || resp.GetWorkspaceDir() == "" {
		t.Fatalf("new session: %v", resp)
	}
	if fi, err := os.Stat(resp.GetWorkspaceDir()); err != nil || !fi.IsDir() {
		t.Fatalf("workspace %s: %v", resp.GetWorkspaceDir(), err)
	}
	if got := h.state(alice, id); got != stateIdle {
		t.Fatalf("state %s", got)
	}
	bobs := h.newSession(bob, "")

	_, err = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "nope"})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "Unknown agent_alias `nope`")
	_, err = h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: "sess_missing"})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, "Session sess_missing not found")
	_, err = h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: "sess_missing", Prompt: "hi"})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, "not found")
	_, err = h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: bobs})
	wantRefusal(t, err, codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, bobs)
	_, err = h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`prompt`")
	_, err = h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id, Limit: -1})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`limit`")
	_, err = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: "a.b"})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`session_id`")
	// The operator acts on anyone's session.
	if got := h.state(operator, bobs); got != stateIdle {
		t.Fatalf("operator reads %s", got)
	}

	list, err := h.srv.List(ctx, &sessionv1.ListRequest{Principal: alice})
	if err != nil || len(list.GetSessions()) != 1 || list.GetSessions()[0].GetSessionId() != id || list.GetSessions()[0].GetState() != stateEnum[stateIdle] {
		t.Fatalf("alice's list: %v %v", list, err)
	}
	if list, err = h.srv.List(ctx, &sessionv1.ListRequest{Principal: operator}); err != nil || len(list.GetSessions()) != 2 {
		t.Fatalf("operator's list: %v %v", list, err)
	}
	att, err := h.srv.Attach(ctx, &sessionv1.AttachRequest{Principal: alice, SessionId: id, ConnectionId: "c1"})
	if err != nil || att.GetSubject() != h.subject(id) || !strings.HasPrefix(att.GetSubject(), "clawmesh.session."+id+".") {
		t.Fatalf("attach: %v %v", att, err)
	}
	_, err = h.srv.Attach(ctx, &sessionv1.AttachRequest{Principal: bob, SessionId: id})
	wantRefusal(t, err, codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, id)

	// close keeps the history; session/new with the id reopens it.
	h.prompt(alice, id, "/say hi")
	if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	if got := h.state(alice, id); got != stateClosed {
		t.Fatalf("after close: %s", got)
	}
	_, err = h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonConflict, "closed")
	if list, _ = h.srv.List(ctx, &sessionv1.ListRequest{Principal: alice}); len(list.GetSessions()) != 0 {
		t.Fatalf("closed session listed as open: %v", list)
	}
	if list, _ = h.srv.List(ctx, &sessionv1.ListRequest{Principal: alice, IncludeClosed: true}); len(list.GetSessions()) != 1 {
		t.Fatalf("closed session not in the history: %v", list)
	}
	re, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id})
	if err != nil || re.GetMessageCount() != 2 || re.GetSessionId() != id {
		t.Fatalf("resume: %v %v", re, err)
	}
	if got := h.prompt(alice, id, "/say again").GetContent(); got != "again" {
		t.Fatalf("resumed session answered %q", got)
	}

	// kill tombstones: history readable, never runs again.
	if _, err := h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	if got := h.state(alice, id); got != stateKilled {
		t.Fatalf("after kill: %s", got)
	}
	_, err = h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id})
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonConflict, "killed")
	if msgs, err := h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id}); err != nil || msgs.GetTotal() != 4 {
		t.Fatalf("killed session's messages: %v %v", msgs, err)
	}

	// delete removes the rows and the workspace.
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	_, err = h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: id})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, id)
	if _, err := os.Stat(resp.GetWorkspaceDir()); !os.IsNotExist(err) {
		t.Fatalf("workspace survived delete: %v", err)
	}
	var n int
	if err := h.pool.QueryRow(ctx, "SELECT count(*) FROM messages WHERE session_id = $1", id).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d messages survived delete (%v)", n, err)
	}

	st, err := h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: operator})
	if err != nil || st.GetActiveSessions() != 1 || st.GetSessionIds()[0] != bobs {
		t.Fatalf("status: %v %v", st, err)
	}
	// Another principal counts every open session but sees only its own.
	st, err = h.srv.Status(ctx, &sessionv1.StatusRequest{Principal: alice})
	if err != nil || st.GetActiveSessions() != 1 || len(st.GetSessionIds()) != 0 {
		t.Fatalf("alice's status: %v %v", st, err)
	}
}

// A turn streams its chunks as the provider produces them: the chunks of
// the first /say arrive while the turn sleeps, before Prompt answers.
func TestTurnStreamsBeforeItEnds(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	gen := int64(7)
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{
		Principal: alice, SessionId: id, Prompt: "/think pondering\n/say Hello streaming world\n/sleep 1500\n/say bye",
		ClientTurnGeneration: &gen, ConnectionId: "c1",
	})

	first := []update{rec.next(), rec.next(), rec.next(), rec.next()}
	if got := types(first); got != "agent_thought_chunk agent_message_chunk agent_message_chunk agent_message_chunk" {
		t.Fatalf("first updates: %s", got)
	}
	select {
	case r := <-res:
		t.Fatalf("the turn ended (%v) before its first chunks were seen: they were not streamed", r.resp)
	default:
	}
	if got := h.state(alice, id); got != stateRunning {
		t.Fatalf("state while the turn sleeps: %s", got)
	}

	rest := rec.until(UpdateTurnComplete)
	all := append(first, rest...)
	checkSeq(t, all)
	if all[0].Seq != 1 {
		t.Fatalf("first seq %d", all[0].Seq)
	}
	if got := texts(all, UpdateMessageChunk); len(got) != 4 || got[0] != "Hello " || got[1] != "streaming " || got[2] != "world" || got[3] != "\nbye" {
		t.Fatalf("message chunks %q", got)
	}
	if got := texts(all, UpdateThoughtChunk); len(got) != 1 || got[0] != "pondering" {
		t.Fatalf("thought chunks %q", got)
	}
	done := all[len(all)-1]
	r := testwait.Recv(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if done.str("outcome") != OutcomeCompleted || done.str("content") != "Hello streaming world\nbye" ||
		done.Params["client_turn_generation"] != float64(7) || done.str("turn_id") != r.resp.GetTurnId() {
		t.Fatalf("turn_complete %v, prompt %v", done.Params, r.resp)
	}
	if r.resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || r.resp.GetContent() != "Hello streaming world\nbye" || r.resp.GetStopReason() != stopEndTurn {
		t.Fatalf("prompt response %v", r.resp)
	}
	rec.quiet(200 * time.Millisecond)
	if got := h.state(alice, id); got != stateIdle {
		t.Fatalf("state after the turn: %s", got)
	}

	msgs, err := h.srv.Messages(context.Background(), &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
	if err != nil || msgs.GetTotal() != 2 || msgs.GetMessages()[0].GetRole() != roleUser || msgs.GetMessages()[1].GetContent() != "Hello streaming world\nbye" {
		t.Fatalf("messages %v %v", msgs, err)
	}

	// The next turn continues the sequence; an ordinary line is said back.
	h.prompt(alice, id, "plain words")
	next := rec.until(UpdateTurnComplete)
	if next[0].Seq != done.Seq+1 || next[len(next)-1].str("content") != "plain words" {
		t.Fatalf("second turn: %v", next)
	}
	if _, ok := next[len(next)-1].Params["client_turn_generation"]; ok {
		t.Fatalf("client_turn_generation without one given: %v", next[len(next)-1].Params)
	}
}

// /fail ends the turn failed, once; the session takes the next prompt.
func TestFailedTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	resp := h.prompt(alice, id, "/say partial\n/fail the model exploded\n/say never")
	if resp.GetOutcome() != outcomeEnum[OutcomeFailed] || resp.GetContent() != "the model exploded" || resp.GetStopReason() != stopError {
		t.Fatalf("prompt %v", resp)
	}
	us := rec.until(UpdateTurnComplete)
	if got := types(us); got != "agent_message_chunk turn_complete" {
		t.Fatalf("updates %s", got)
	}
	if last := us[1]; last.str("outcome") != OutcomeFailed || last.str("error") != "the model exploded" {
		t.Fatalf("turn_complete %v", last.Params)
	}
	rec.quiet(200 * time.Millisecond)
	if got := h.prompt(alice, id, "/say ok").GetOutcome(); got != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("next turn %s", got)
	}
	// An agent whose provider is unknown fails its turns, clearly.
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "odd", Provider: "telepathy"}})
	odd := h.newSession(alice, "odd")
	if r := h.prompt(alice, odd, "hi"); r.GetOutcome() != outcomeEnum[OutcomeFailed] || r.GetContent() != "Agent `odd` names unknown provider `telepathy`" {
		t.Fatalf("unknown provider: %v", r)
	}
}

// What a failed turn streamed before it failed stays in the transcript,
// before the failure, as a cancelled or interrupted turn's does; its
// followers saw it, and the provider is given it at the next turn. The
// transcript held the prompt and "Turn failed: ..." only, while /context
// showed the provider the lost reply.
func TestFailedTurnKeepsWhatItStreamed(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	if r := h.prompt(alice, id, "/say partial words\n/tool echo {}\n/say more\n/fail boom"); r.GetOutcome() != outcomeEnum[OutcomeFailed] {
		t.Fatalf("prompt %v", r)
	}
	if r := h.prompt(alice, id, "/fail at once"); r.GetOutcome() != outcomeEnum[OutcomeFailed] {
		t.Fatalf("prompt %v", r)
	}
	var got []string
	for _, m := range h.transcript(id) {
		got = append(got, m.GetRole()+": "+m.GetContent())
	}
	want := []string{
		"user: /say partial words\n/tool echo {}\n/say more\n/fail boom", "assistant: partial words", "tool: echo: {}", "assistant: \nmore",
		"system: Turn failed: boom",
		"user: /fail at once", "system: Turn failed: at once",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("transcript\n%q\nwant\n%q", got, want)
	}
}

// A second prompt during a running turn is SESSION_BUSY; session/cancel
// ends the turn cancelled, once, and the session is idle and usable.
func TestBusyAndCancel(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say working\n/sleep 60000\n/say never"})
	if u := rec.next(); u.Type != UpdateMessageChunk {
		t.Fatalf("first update %v", u)
	}
	_, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "again"})
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonSessionBusy, "running")
	st, err := h.srv.State(context.Background(), &sessionv1.StateRequest{Principal: alice, SessionId: id})
	if err != nil || st.GetState() != stateEnum[stateRunning] || st.GetTurnId() == "" {
		t.Fatalf("state %v %v", st, err)
	}

	c, err := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id})
	if err != nil || !c.GetCancelled() {
		t.Fatalf("cancel %v %v", c, err)
	}
	// Cancel returns once the turn ended: idle right away.
	if got := h.state(alice, id); got != stateIdle {
		t.Fatalf("state after cancel: %s", got)
	}
	r := testwait.Recv(t, res)
	if r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] || r.resp.GetContent() != "working" || r.resp.GetTurnId() != st.GetTurnId() {
		t.Fatalf("cancelled prompt %v %v", r.resp, r.err)
	}
	us := rec.until(UpdateTurnComplete)
	if len(us) != 1 || us[0].str("outcome") != OutcomeCancelled {
		t.Fatalf("after cancel: %v", us)
	}
	rec.quiet(200 * time.Millisecond)
	if c, _ := h.srv.Cancel(context.Background(), &sessionv1.CancelRequest{Principal: alice, SessionId: id}); c.GetCancelled() {
		t.Fatal("cancel with no turn running said cancelled")
	}
	if got := h.prompt(alice, id, "/say back").GetContent(); got != "back" {
		t.Fatalf("after cancel the session answered %q", got)
	}
}

// ConnectionClosed cancels the turns that connection started, and only
// those; the caller leaving cancels its turn too.
func TestConnectionClosedCancelsTurns(t *testing.T) {
	h := newHarness(t)
	a, b := h.newSession(alice, "default"), h.newSession(alice, "default")
	ra, rb := h.record(a), h.record(b)
	resA := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: a, Prompt: "/say a\n/sleep 60000", ConnectionId: "conn-1"})
	resB := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: b, Prompt: "/say b\n/sleep 60000", ConnectionId: "conn-2"})
	ra.next()
	rb.next()

	cc, err := h.srv.ConnectionClosed(context.Background(), &sessionv1.ConnectionClosedRequest{ConnectionId: "conn-1"})
	if err != nil || cc.GetCancelledTurns() != 1 {
		t.Fatalf("connection closed: %v %v", cc, err)
	}
	if r := testwait.Recv(t, resA); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] {
		t.Fatalf("conn-1's turn: %v %v", r.resp, r.err)
	}
	if u := ra.until(UpdateTurnComplete); u[0].str("outcome") != OutcomeCancelled {
		t.Fatalf("turn_complete %v", u[0].Params)
	}
	if got := h.state(alice, a); got != stateIdle {
		t.Fatalf("state %s", got)
	}
	if got := h.state(alice, b); got != stateRunning {
		t.Fatalf("conn-2's turn was touched: %s", got)
	}
	if got := h.prompt(alice, a, "/say next").GetContent(); got != "next" {
		t.Fatalf("after ConnectionClosed the session answered %q", got)
	}
	ra.until(UpdateTurnComplete)

	// The Prompt call's own context ending cancels its turn as well.
	ctx, cancel := context.WithCancel(context.Background())
	resC := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: a, Prompt: "/say c\n/sleep 60000"})
	ra.until(UpdateMessageChunk)
	cancel()
	if r := testwait.Recv(t, resC); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] {
		t.Fatalf("caller gone: %v %v", r.resp, r.err)
	}

	// Shutdown cancels what still runs, with its turn_complete.
	h.srv.Shutdown()
	if r := testwait.Recv(t, resB); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] {
		t.Fatalf("at shutdown: %v %v", r.resp, r.err)
	}
	if u := rb.until(UpdateTurnComplete); u[len(u)-1].str("outcome") != OutcomeCancelled {
		t.Fatalf("turn_complete at shutdown %v", u)
	}
	_, err = h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: b, Prompt: "late"})
	if err == nil {
		t.Fatal("prompt accepted after shutdown")
	}
}

// A cancel that reaches a turn once its provider has answered, while the
// turn writes its end, does not cancel it: the turn completes, and Cancel
// says it cancelled nothing. It said cancelled: true, beside a
// turn_complete and a prompt's answer of outcome completed (1 round of 20
// over the socket, a cancel sent as a one-line reply streamed).
func TestCancelSaysWhetherTheTurnEndedCancelled(t *testing.T) {
	p := stubbornProvider{started: make(chan struct{}, 1), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.Providers = map[string]ProviderFactory{"stubborn": func(AgentConfig) (Provider, error) { return p, nil }}
	})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "slow", Provider: "stubborn"}})
	ctx := context.Background()
	id := h.newSession(alice, "slow")
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
	<-p.started
	turn := h.srv.lookupLive(id).running()

	// The session's row, held, keeps the turn's end from being written
	// once the provider has answered.
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	close(p.release)
	eventually(t, func() error {
		var n int
		if err := h.pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted").Scan(&n); err != nil || n == 0 {
			return fmt.Errorf("the turn's end does not wait for the session's row yet (%v)", err)
		}
		return nil
	})
	cancelled := make(chan *sessionv1.CancelResponse, 1)
	go func() {
		c, err := h.srv.Cancel(ctx, &sessionv1.CancelRequest{Principal: alice, SessionId: id})
		if err != nil {
			t.Error(err)
		}
		cancelled <- c
	}()
	eventually(t, func() error {
		if turn.ctx.Err() == nil {
			return fmt.Errorf("the cancel has not reached the turn yet")
		}
		return nil
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := testwait.Recv(t, res)
	c := testwait.Recv(t, cancelled)
	if r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCompleted] || r.resp.GetContent() != "late reply" {
		t.Fatalf("prompt: %v %v", r.resp, r.err)
	}
	if c.GetCancelled() {
		t.Fatal("cancel said cancelled of a turn that completed")
	}
}
