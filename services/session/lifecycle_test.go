package session

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// sessionTables are every table of the session schema that holds rows of
// a session.
var sessionTables = []string{"sessions", "messages", "tool_calls", "turns", "approvals", "checkpoint_events", "context_snapshots"}

func (h *harness) rowsOf(id string) map[string]int {
	h.t.Helper()
	out := map[string]int{}
	for _, table := range sessionTables {
		out[table] = h.count("SELECT count(*) FROM "+table+" WHERE session_id = $1", id)
	}
	return out
}

// session/kill cancels the running turn first, then writes the tombstone:
// with the write failing, the turn is stopped all the same, the RPC fails
// and the session stays usable; once the write works the session is
// killed and never resumed.
func TestKillCancelsBeforeItWrites(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	rec := h.record(id)
	h.exec(`CREATE FUNCTION refuse_kill() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.state = 'killed' THEN RAISE EXCEPTION 'tombstone refused by the test'; END IF; RETURN NEW; END $$`)
	h.exec("CREATE TRIGGER refuse_kill BEFORE UPDATE ON sessions FOR EACH ROW EXECUTE FUNCTION refuse_kill()")

	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say working\n/sleep 60000\n/say never"})
	rec.next()
	if _, err := h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: id}); err == nil || !strings.Contains(err.Error(), "tombstone refused") {
		t.Fatalf("kill with a failing write: %v", err)
	}
	if r := testwait.Recv(t, res); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] || r.resp.GetContent() != "working" {
		t.Fatalf("the turn kill meant to stop: %v %v", r.resp, r.err)
	}
	if got := h.state(alice, id); got != stateIdle {
		t.Fatalf("after the failed kill: %s", got)
	}
	if h.srv.lookupLive(id) == nil {
		t.Fatal("the failed kill dropped the live session")
	}

	h.exec("DROP TRIGGER refuse_kill ON sessions")
	if got := h.prompt(alice, id, "/say still here").GetContent(); got != "still here" {
		t.Fatalf("after the failed kill the session answered %q", got)
	}
	if _, err := h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	_, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id})
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonConflict, "killed")
	_, err = h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: bob, SessionId: id})
	wantRefusal(t, err, codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, id)
}

// A row read before its session was deleted and its id named a new one
// (a prompt that read it a moment before) must not take the new
// session's place in memory, nor run anything: its entry refuses a
// turn as a deleted session's does. The new session's row, held after a
// deleted one's entry is still in memory, replaces it.
func TestHoldOfAReplacedIncarnation(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	old, oldLive, release, cur := h.reuseHeld(alice, id)
	newLive, releaseNew := h.srv.hold(ctx, cur)
	defer releaseNew()
	if newLive == oldLive || newLive.incarnation != cur.Incarnation || h.srv.lookupLive(id) != newLive {
		t.Fatal("the new session was given the deleted one's entry")
	}
	release()

	stale, releaseStale := h.srv.hold(ctx, old)
	defer releaseStale()
	if h.srv.lookupLive(id) != newLive {
		t.Fatal("a row of the deleted session replaced the new session's entry")
	}
	_, _, err := h.srv.admit(ctx, stale, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say hi"}, "/say hi")
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, id)
	// The new session runs.
	h.prompt(alice, id, "/say hi")
}

// session/delete removes every row of the session, its checkpoints and
// retained context included; session/new with the id then starts afresh.
func TestDeleteRemovesEveryRow(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}}})
	id := h.newSession(alice, "guarded")
	rec := h.record(id)
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say hi\n/tool echo {}"})
	ask := rec.until(UpdateApprovalRequest)
	approve, err := h.srv.Approve(ctx, &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: ask[len(ask)-1].str("request_id"),
		Decision: sessionv1.Decision_DECISION_ALLOW_ONCE})
	if err != nil || !approve.GetAcknowledged() {
		t.Fatalf("approve %v %v", approve, err)
	}
	testwait.Recv(t, res)
	for table, n := range h.rowsOf(id) {
		if n == 0 {
			t.Fatalf("the turn left no row in %s", table)
		}
	}
	deletedSubject, deletedIncarnation := h.subject(id), h.incarnation(id)
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	// The deletion is the last update on the deleted session's subject.
	for deleted := false; !deleted; {
		select {
		case m := <-rec.ch:
			u := &busv1.SessionUpdate{}
			if err := proto.Unmarshal(m.Data, u); err != nil {
				t.Fatal(err)
			}
			deleted = u.GetType() == busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED
		case <-time.After(wait):
			t.Fatal("no deletion on the deleted session's subject")
		}
	}
	for table, n := range h.rowsOf(id) {
		if n != 0 {
			t.Fatalf("%d rows left in %s", n, table)
		}
	}
	if h.srv.lookupLive(id) != nil {
		t.Fatal("the live session outlived delete")
	}
	re, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id})
	if err != nil || re.GetSessionId() != id || re.GetMessageCount() != 0 || !re.GetCreated() {
		t.Fatalf("session/new after delete: %v %v", re, err)
	}
	// The new session's updates have a subject of their own (the deleted
	// session's may still be on their way to a gateway, the deletion
	// last). The same call again resumes it: not created, the same
	// subject.
	if re.GetUpdateSubject() == deletedSubject || re.GetUpdateSubject() != h.subject(id) {
		t.Fatalf("the new session's subject %q, the deleted one's %q", re.GetUpdateSubject(), deletedSubject)
	}
	again, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, SessionId: id})
	if err != nil || again.GetCreated() || again.GetUpdateSubject() != re.GetUpdateSubject() {
		t.Fatalf("session/new of an existing session: %v %v", again, err)
	}
	// A prompt from a gateway that follows the deleted session is refused
	// before any turn (its updates would not reach it); it attaches again.
	_, err = h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say hi", Incarnation: deletedIncarnation})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, id)
	newRec := h.record(id)
	given := contextOf(t, h.prompt(alice, id, "/context").GetContent())
	if roles(given) != "user" {
		t.Fatalf("the new session was given %+v", given)
	}
	newRec.until(UpdateTurnComplete)
	if _, err := h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say hi", Incarnation: h.incarnation(id)}); err != nil {
		t.Fatal(err)
	}
	newRec.until(UpdateTurnComplete)
	rec.quiet(200 * time.Millisecond)

	// With no live session (the process restarted), the durable row is
	// what delete finds and removes.
	h.restart()
	if h.srv.lookupLive(id) != nil {
		t.Fatal("a live session before any use")
	}
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	for table, n := range h.rowsOf(id) {
		if n != 0 {
			t.Fatalf("%d rows left in %s", n, table)
		}
	}
}

// With PostgreSQL stopped, kill and delete of an idle session fail as a
// database outage (-32603 at the edge), the live session is kept, and the
// rows are intact once PostgreSQL is back. A running turn is cancelled all
// the same: kill and delete reach it in memory first.
func TestKillAndDeleteWhilePostgresIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster of its own")
	}
	server := testenv.PrivatePostgres(t)
	h := newHarnessOn(t, server.URL(), func(c *Config) { c.UnwindTimeout = 2 * time.Second })
	ctx := context.Background()
	idle := h.newSession(alice, "default")
	busy := h.newSession(alice, "default")
	rec := h.record(idle)
	h.prompt(alice, idle, "/say kept")
	last := rec.until(UpdateTurnComplete)
	rows := h.rowsOf(idle)
	busyRec := h.record(busy)
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: busy, Prompt: "/say working\n/sleep 60000"})
	busyRec.next()

	server.Stop()
	for name, call := range map[string]func(string) error{
		"kill": func(id string) error {
			_, err := h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: id})
			return err
		},
		"delete": func(id string) error {
			_, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id})
			return err
		},
	} {
		if err := call(idle); !pg.IsUnavailable(err) {
			t.Fatalf("%s of an idle session with the database down: %v", name, err)
		}
		ls := h.srv.lookupLive(idle)
		if ls == nil || ls.deleting || ls.ending != "" {
			t.Fatalf("after the failed %s the live session is %+v", name, ls)
		}
	}
	if err := h.srvKill(busy); !pg.IsUnavailable(err) {
		t.Fatalf("kill of a running session with the database down: %v", err)
	}
	if r := testwait.Recv(t, res); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] {
		t.Fatalf("the running turn: %v %v", r.resp, r.err)
	}
	if u := busyRec.until(UpdateTurnComplete); u[len(u)-1].str("outcome") != OutcomeCancelled {
		t.Fatalf("turn_complete %v", u)
	}

	server.Start()
	eventually(t, func() error {
		_, err := h.srv.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: idle})
		return err
	})
	if got := h.rowsOf(idle); fmt.Sprint(got) != fmt.Sprint(rows) {
		t.Fatalf("rows after the outage %v, before %v", got, rows)
	}
	if got := h.state(alice, idle); got != stateIdle {
		t.Fatalf("state after the outage: %s", got)
	}
	// The same live session goes on: its updates continue the sequence.
	h.prompt(alice, idle, "/say again")
	if next := rec.until(UpdateTurnComplete); next[0].Seq != last[len(last)-1].Seq+1 {
		t.Fatalf("seq %d after %d", next[0].Seq, last[len(last)-1].Seq)
	}
	if _, err := h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: idle}); err != nil {
		t.Fatalf("kill once the database is back: %v", err)
	}
}

func (h *harness) srvKill(id string) error {
	_, err := h.srv.Kill(context.Background(), &sessionv1.KillRequest{Principal: alice, SessionId: id})
	return err
}

// The in-memory half of a session is dropped once idle: after many
// sessions were used the map holds only those with a running turn or a
// pending approval, and a session used again continues its update
// sequence without a gap.
func TestIdleLiveSessionsEvicted(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.LiveIdleTimeout = time.Hour })
	ctx := context.Background()
	const n = 200
	ids := make([]string, n)
	lastSeq := map[string]int64{}
	for i := range ids {
		ids[i] = h.newSession(alice, "default")
	}
	rec := h.record(ids[0])
	for _, id := range ids {
		h.prompt(alice, id, "/say touched")
	}
	touched := rec.until(UpdateTurnComplete)
	lastSeq[ids[0]] = touched[len(touched)-1].Seq

	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}}})
	asking, running := h.newSession(alice, "guarded"), h.newSession(alice, "default")
	askRec, runRec := h.record(asking), h.record(running)
	askRes := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: asking, Prompt: "/tool echo {}"})
	ask := askRec.until(UpdateApprovalRequest)
	runRes := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: running, Prompt: "/say on\n/sleep 60000"})
	runRec.next()

	h.srv.mu.Lock()
	before := len(h.srv.lives)
	h.srv.mu.Unlock()
	if before != n+2 {
		t.Fatalf("%d live sessions before the sweep", before)
	}
	// Not idle long enough: nothing goes.
	if got := h.srv.evictIdle(time.Now()); got != 0 {
		t.Fatalf("%d evicted before their idle time", got)
	}
	if got := h.srv.evictIdle(time.Now().Add(time.Hour + time.Second)); got != n {
		t.Fatalf("%d evicted, want %d", got, n)
	}
	h.srv.mu.Lock()
	left := len(h.srv.lives)
	_, keptAsk := h.srv.lives[asking]
	_, keptRun := h.srv.lives[running]
	h.srv.mu.Unlock()
	if left != 2 || !keptAsk || !keptRun {
		t.Fatalf("after the sweep %d live sessions (asking %v, running %v)", left, keptAsk, keptRun)
	}

	h.prompt(alice, ids[0], "/say back")
	if next := rec.until(UpdateTurnComplete); next[0].Seq != lastSeq[ids[0]]+1 {
		t.Fatalf("seq %d after %d: the sequence has a gap", next[0].Seq, lastSeq[ids[0]])
	}
	if _, err := h.srv.Approve(ctx, &sessionv1.ApproveRequest{Principal: alice, SessionId: asking, RequestId: ask[len(ask)-1].str("request_id"),
		Decision: sessionv1.Decision_DECISION_REJECT}); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, askRes)
	if _, err := h.srv.Cancel(ctx, &sessionv1.CancelRequest{Principal: alice, SessionId: running}); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, runRes)
}

// With a short idle time the sweeper alone keeps the map bounded.
func TestLiveSessionsSwept(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.LiveIdleTimeout = 50 * time.Millisecond })
	for range 30 {
		h.prompt(alice, h.newSession(alice, "default"), "/say touched")
	}
	eventually(t, func() error {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		if n := len(h.srv.lives); n != 0 {
			return fmt.Errorf("%d live sessions", n)
		}
		return nil
	})
}

// stubbornProvider holds its step until release is closed, whatever its
// context says (a provider library that does not watch it), then says
// "late reply".
type stubbornProvider struct {
	started chan struct{}
	release chan struct{}
}

func (p stubbornProvider) Step(ctx context.Context, req ProviderRequest, emit func(Chunk)) (StepResult, error) {
	select {
	case p.started <- struct{}{}:
	default:
	}
	<-p.release
	emit(Chunk{Text: "late reply"})
	return StepResult{}, nil
}

// A turn that outlives its session's Delete (which waits UnwindTimeout
// for it, then frees the id) writes nothing once it ends: the id may name
// another principal's session by then, and the deleted session's reply
// landed in that session's transcript and set its state.
func TestTurnOutlivingDeleteWritesNothingIntoTheNextSession(t *testing.T) {
	p := stubbornProvider{started: make(chan struct{}, 1), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 300 * time.Millisecond
		c.Providers = map[string]ProviderFactory{"stubborn": func(AgentConfig) (Provider, error) { return p, nil }}
	})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "slow", Provider: "stubborn"}})
	ctx := context.Background()
	id := h.newSession(alice, "slow")
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
	<-p.started
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: bob, AgentAlias: "default", SessionId: id}); err != nil {
		t.Fatal(err)
	}
	// bob's session runs a turn of its own while alice's ends.
	bobs := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: bob, SessionId: id, Prompt: "/sleep 2000"})
	eventually(t, func() error {
		if st := h.state(bob, id); st != stateRunning {
			return fmt.Errorf("bob's session %s", st)
		}
		return nil
	})
	close(p.release)
	select {
	case <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("alice's turn never ended")
	}
	var n int
	var state string
	if err := h.pool.QueryRow(ctx, "SELECT message_count, state FROM sessions WHERE session_id = $1", id).Scan(&n, &state); err != nil {
		t.Fatal(err)
	}
	if n != 1 || state != stateRunning {
		t.Fatalf("bob's session holds %d messages and is %s; want its own prompt, running", n, state)
	}
	if err := h.pool.QueryRow(ctx, "SELECT count(*) FROM checkpoint_events WHERE session_id = $1 AND turn_id NOT IN (SELECT turn_id FROM turns)", id).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d checkpoint events of a turn not bob's (%v)", n, err)
	}
	if r := <-bobs; r.err != nil {
		t.Fatal(r.err)
	}
}

// A delete or kill that arrives while a close waits for the session's
// turn to end waits for the close, then does what it was asked; a close
// that arrives during a kill is refused as the kill left the session.
// They were refused at once with "Session X is closed; resume it with
// session/new and its session_id", though the session was not closed
// yet (and would stay open if the close's write failed), and a closed
// session may be deleted or killed.
func TestLifecycleCallsDuringAnotherWaitForIt(t *testing.T) {
	p := stubbornProvider{started: make(chan struct{}, 1), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 30 * time.Second
		c.Providers = map[string]ProviderFactory{"stubborn": func(AgentConfig) (Provider, error) { return p, nil }}
	})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "slow", Provider: "stubborn"}})
	ctx := context.Background()
	ending := func(id string) error {
		ls := h.srv.lookupLive(id)
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if ls.ending == "" {
			return fmt.Errorf("no close or kill under way")
		}
		return nil
	}
	for _, c := range []struct {
		first, then string
		wantErr     string
	}{
		{"close", "delete", ""},
		{"close", "kill", ""},
		{"kill", "close", "was killed"},
	} {
		id := h.newSession(alice, "slow")
		res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
		<-p.started
		call := func(op string) error {
			var err error
			switch op {
			case "close":
				_, err = h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: alice, SessionId: id})
			case "kill":
				_, err = h.srv.Kill(ctx, &sessionv1.KillRequest{Principal: alice, SessionId: id})
			case "delete":
				_, err = h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id})
			}
			return err
		}
		firstDone, thenDone := make(chan error, 1), make(chan error, 1)
		go func() { firstDone <- call(c.first) }()
		eventually(t, func() error { return ending(id) })
		go func() { thenDone <- call(c.then) }()
		// The provider answers only now: the turn ends, then the first
		// call, then the second.
		p.release <- struct{}{}
		if err := testwait.Recv(t, firstDone); err != nil {
			t.Fatalf("%s: %v", c.first, err)
		}
		err := testwait.Recv(t, thenDone)
		if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Fatalf("%s during %s: %v, want %q", c.then, c.first, err, c.wantErr)
		}
		testwait.Recv(t, res)
		want := map[string]string{"delete": "gone", "kill": stateKilled, "close": stateKilled}[c.then]
		var state string
		if err := h.pool.QueryRow(ctx, "SELECT state FROM sessions WHERE session_id = $1", id).Scan(&state); err != nil {
			state = "gone"
		}
		if state != want {
			t.Fatalf("%s during %s left the session %s, want %s", c.then, c.first, state, want)
		}
	}
}

// A turn whose provider ignores its cancellation past the unwind bound
// still ends, for its followers, before its session's deletion is
// announced: the deletion detaches every gateway's connections from the
// session, so a turn_complete published after it reached nobody, and
// the client that prompted never saw its turn end. It ends once: the
// provider's late return publishes no second turn_complete, and the
// prompt answers as the turn_complete said.
func TestTurnOutlivingDeleteEndsBeforeTheDeletion(t *testing.T) {
	p := stubbornProvider{started: make(chan struct{}, 1), release: make(chan struct{})}
	h := newHarness(t, func(c *Config) {
		c.UnwindTimeout = 300 * time.Millisecond
		c.Providers = map[string]ProviderFactory{"stubborn": func(AgentConfig) (Provider, error) { return p, nil }}
	})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "slow", Provider: "stubborn"}})
	var once sync.Once
	release := func() { once.Do(func() { close(p.release) }) }
	t.Cleanup(release) // before the server's shutdown, which waits for the turn
	ctx := context.Background()
	id := h.newSession(alice, "slow")
	msgs := make(chan *nats.Msg, 64)
	sub, err := h.listen.ChanSubscribe(h.subject(id), msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := h.listen.Flush(); err != nil {
		t.Fatal(err)
	}
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "hi"})
	<-p.started
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: alice, SessionId: id}); err != nil {
		t.Fatal(err)
	}
	next := func() *busv1.SessionUpdate {
		t.Helper()
		select {
		case m := <-msgs:
			u := &busv1.SessionUpdate{}
			if err := proto.Unmarshal(m.Data, u); err != nil {
				t.Fatal(err)
			}
			return u
		case <-time.After(wait):
			t.Fatal("no update")
			return nil
		}
	}
	var seen []string
	var end map[string]any
	for {
		u := next()
		seen = append(seen, u.GetType().String())
		if u.GetType() == busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE {
			if err := json.Unmarshal([]byte(u.GetJson()), &end); err != nil {
				t.Fatal(err)
			}
		}
		if u.GetType() == busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED {
			break
		}
	}
	if end == nil {
		t.Fatalf("the session's deletion was announced before its turn ended: %v", seen)
	}
	release()
	var r promptResult
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the turn never ended")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if word, _ := end["outcome"].(string); r.resp.GetOutcome() != outcomeEnum[word] || r.resp.GetTurnId() != end["turn_id"] ||
		r.resp.GetContent() != end["content"] {
		t.Fatalf("the prompt answered turn %s %s %q; its turn_complete said %v", r.resp.GetTurnId(), r.resp.GetOutcome(), r.resp.GetContent(), end)
	}
	select {
	case m := <-msgs:
		u := &busv1.SessionUpdate{}
		_ = proto.Unmarshal(m.Data, u)
		if u.GetType() == busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE {
			t.Fatalf("a second turn_complete: %s", u.GetJson())
		}
	case <-time.After(200 * time.Millisecond):
	}
}
