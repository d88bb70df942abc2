package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// durableStack runs the stack on a PostgreSQL of the test's own, which the
// test reads directly (the session schema) and may stop and start.
func durableStack(t *testing.T, args ...string) (*e2e.Stack, *testenv.PGServer, *pgx.Conn) {
	t.Helper()
	pg := testenv.PrivatePostgres(t)
	s := e2e.Start(t, e2e.Options{Env: []string{"DATABASE_URL=" + pg.URL()}, Args: args})
	return s, pg, dbConn(t, pg)
}

func dbConn(t *testing.T, pg *testenv.PGServer) *pgx.Conn {
	t.Helper()
	ctx := e2e.Context(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// sessionRows counts a session's rows in every table of the session
// schema.
func sessionRows(t *testing.T, db *pgx.Conn, id string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"sessions", "messages", "tool_calls", "turns", "approvals", "checkpoint_events", "context_snapshots"} {
		var n int
		if err := db.QueryRow(context.Background(), "SELECT count(*) FROM session."+table+" WHERE session_id = $1", id).Scan(&n); err != nil {
			t.Fatalf("count %s: %v", table, err)
		}
		out[table] = n
	}
	return out
}

type transcriptRow struct {
	Index   int    `json:"index"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

func (v *conv) transcript(id string) []transcriptRow {
	v.t.Helper()
	var r struct {
		Messages []transcriptRow `json:"messages"`
	}
	if err := json.Unmarshal(v.call("session/messages", map[string]any{"session_id": id}), &r); err != nil {
		v.t.Fatal(err)
	}
	return r.Messages
}

// contextLine is one message the scripted provider's /context says it was
// given.
type contextLine struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []any  `json:"tool_calls"`
}

func (v *conv) providerContext(id string) []contextLine {
	v.t.Helper()
	var pr struct{ Content string }
	if err := json.Unmarshal(v.call("session/prompt", map[string]any{"session_id": id, "prompt": "/context"}), &pr); err != nil {
		v.t.Fatal(err)
	}
	var out []contextLine
	for _, l := range strings.Split(pr.Content, "\n") {
		var m contextLine
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			v.t.Fatalf("context line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func contextRoles(ms []contextLine) string {
	var rs []string
	for _, m := range ms {
		rs = append(rs, m.Role)
	}
	return strings.Join(rs, ",")
}

// SIGKILL of the session service in the middle of a turn: what the client
// saw of it before the kill is in the transcript after the restart, with
// one interruption marker; the next provider context holds the text and
// not the marker.
func TestSessionRecoversAfterSIGKILL(t *testing.T) {
	t.Parallel()
	s, _, db := durableStack(t)
	v := newConv(t, s, nil)
	id := v.newSession("")
	const prompt = "/say first half\n/sleep 20000\n/say second half"
	promptID := v.send("session/prompt", map[string]any{"session_id": id, "prompt": prompt})
	seen := ""
	for seen != "first half" {
		if u, ok := v.upd(v.next()); ok && u.Type == "agent_message_chunk" {
			seen += u.Text
		}
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		var stored string
		if err := db.QueryRow(context.Background(), `SELECT COALESCE(string_agg(content, '' ORDER BY seq), '')
			FROM session.checkpoint_events WHERE session_id = $1 AND kind = 'text'`, id).Scan(&stored); err != nil {
			return err
		}
		if stored != seen {
			return fmt.Errorf("checkpoint holds %q", stored)
		}
		return nil
	})

	pid := s.PIDOf("session")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The prompt gets its answer (an error: its process died), and the
	// restarted service's recovery sends the turn's one turn_complete.
	var answered, completed bool
	for !answered || !completed {
		f := v.next()
		if u, ok := v.upd(f); ok {
			if u.Type == "turn_complete" {
				if completed || u.Outcome != "cancelled" || u.Content != "first half" {
					t.Fatalf("turn_complete %+v", u)
				}
				completed = true
			}
			continue
		}
		if string(f.ID) == promptID {
			answered = true
		}
	}
	if p := s.PIDOf("session"); p == 0 || p == pid {
		t.Fatalf("session service not restarted (pid %d)", p)
	}
	// Recovery runs before the restarted service serves: wait for it.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		_, f := v.until(v.send("session/state", map[string]any{"session_id": id}))
		if f.Error != nil {
			return fmt.Errorf("session/state: %s", f.Error.Message)
		}
		return nil
	})

	rows := v.transcript(id)
	want := []transcriptRow{{0, "user", prompt}, {1, "assistant", "first half"}, {2, "system", ""}}
	if len(rows) != len(want) {
		t.Fatalf("transcript %+v", rows)
	}
	for i, w := range want {
		if rows[i].Index != w.Index || rows[i].Role != w.Role || (w.Content != "" && rows[i].Content != w.Content) {
			t.Fatalf("transcript row %d %+v, want %+v", i, rows[i], w)
		}
	}
	marker := rows[2].Content
	if !strings.Contains(marker, "interrupted") {
		t.Fatalf("marker %q", marker)
	}
	given := v.providerContext(id)
	if contextRoles(given) != "user,assistant,user" || given[0].Content != prompt || given[1].Content != "first half" {
		t.Fatalf("the provider was given %+v", given)
	}
	for _, m := range given {
		if m.Content == marker {
			t.Fatalf("the marker reached the provider: %+v", given)
		}
	}
	markers := 0
	for _, r := range v.transcript(id) {
		if r.Content == marker {
			markers++
		}
	}
	if markers != 1 {
		t.Fatalf("%d markers", markers)
	}
}

// close, kill and delete over the socket, each with its durable meaning,
// and the retained context's trim reaching the client.
func TestSessionDurableLifecycle(t *testing.T) {
	t.Parallel()
	s, _, db := durableStack(t,
		"--set", "agents.tiny.provider=scripted", "--set", "agents.tiny.context_budget_tokens=60")
	v := newConv(t, s, nil)
	other := newConv(t, s, nil)

	// close keeps a resumable history.
	closed := v.newSession("")
	v.call("session/prompt", map[string]any{"session_id": closed, "prompt": `/say kept words` + "\n" + `/tool echo {"n":1}`})
	var cr struct{ Closed bool }
	json.Unmarshal(v.call("session/close", map[string]any{"session_id": closed}), &cr)
	if !cr.Closed {
		t.Fatal("session/close did not say closed")
	}
	_, f := v.until(v.send("session/prompt", map[string]any{"session_id": closed, "prompt": "/say no"}))
	if f.Error == nil {
		t.Fatal("a closed session ran a turn")
	}
	var re struct {
		MessageCount int `json:"message_count"`
	}
	json.Unmarshal(v.call("session/new", map[string]any{"session_id": closed}), &re)
	if re.MessageCount != 3 {
		t.Fatalf("resumed with %d messages", re.MessageCount)
	}
	if given := v.providerContext(closed); contextRoles(given) != "user,assistant,tool,user" || given[1].Content != "kept words" {
		t.Fatalf("the resumed session's provider was given %+v", given)
	}

	// kill keeps the history and refuses to resume.
	v.call("session/kill", map[string]any{"session_id": closed})
	_, f = v.until(v.send("session/new", map[string]any{"session_id": closed}))
	if f.Error == nil || !strings.Contains(f.Error.Message, "killed") {
		t.Fatalf("resume of a killed session: %+v", f.Error)
	}
	if rows := v.transcript(closed); len(rows) != 5 {
		t.Fatalf("killed session's transcript %+v", rows)
	}

	// delete removes every row; the id then starts afresh.
	gone := v.newSession("")
	v.call("session/prompt", map[string]any{"session_id": gone, "prompt": `/tool echo {"n":2}` + "\n/say done"})
	if rows := sessionRows(t, db, gone); rows["checkpoint_events"] == 0 || rows["tool_calls"] == 0 || rows["context_snapshots"] == 0 {
		t.Fatalf("the turn left %v", rows)
	}
	var dr struct{ Deleted bool }
	json.Unmarshal(v.call("session/delete", map[string]any{"session_id": gone}), &dr)
	if !dr.Deleted {
		t.Fatal("session/delete did not say deleted")
	}
	for table, n := range sessionRows(t, db, gone) {
		if n != 0 {
			t.Fatalf("%d rows left in %s", n, table)
		}
	}
	json.Unmarshal(v.call("session/new", map[string]any{"session_id": gone}), &re)
	if re.MessageCount != 0 {
		t.Fatalf("the id came back with %d messages", re.MessageCount)
	}
	if given := v.providerContext(gone); contextRoles(given) != "user" {
		t.Fatalf("the fresh session's provider was given %+v", given)
	}

	// kill during a running turn stops it, even when the tombstone cannot
	// be written.
	busy := v.newSession("")
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE FUNCTION session.refuse_kill() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.state = 'killed' THEN RAISE EXCEPTION 'tombstone refused by the test'; END IF; RETURN NEW; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "CREATE TRIGGER refuse_kill BEFORE UPDATE ON session.sessions FOR EACH ROW EXECUTE FUNCTION session.refuse_kill()"); err != nil {
		t.Fatal(err)
	}
	promptID := v.send("session/prompt", map[string]any{"session_id": busy, "prompt": "/say working\n/sleep 60000\n/say never"})
	if u, ok := v.upd(v.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("turn did not start")
	}
	_, f = other.until(other.send("session/kill", map[string]any{"session_id": busy}))
	if f.Error == nil || f.Error.Code != -32603 {
		t.Fatalf("kill with a failing tombstone: %+v", f.Error)
	}
	ups, resp := v.until(promptID)
	var pr struct{ Outcome, Content string }
	json.Unmarshal(resp.Result, &pr)
	if resp.Error != nil || pr.Outcome != "cancelled" || pr.Content != "working" || countType(ups, "turn_complete") != 1 {
		t.Fatalf("the turn kill meant to stop: %s %+v %+v", resp.Result, resp.Error, ups)
	}
	if _, err := db.Exec(ctx, "DROP TRIGGER refuse_kill ON session.sessions"); err != nil {
		t.Fatal(err)
	}
	other.call("session/kill", map[string]any{"session_id": busy})

	// A small budget: a turn of "/say" and seven words is 27 estimated
	// tokens, so the third turn's context (68) passes 60 and the first turn
	// goes; the client is told before the turn streams.
	tiny := v.newSession("tiny")
	const say = "/say aaaa bbbb cccc dddd eeee ffff gggg"
	for range 2 {
		ups, _ := v.until(v.send("session/prompt", map[string]any{"session_id": tiny, "prompt": say}))
		if countType(ups, "history_trimmed") != 0 {
			t.Fatalf("trimmed within the budget: %+v", ups)
		}
	}
	before := v.transcript(tiny)
	id := v.send("session/prompt", map[string]any{"session_id": tiny, "prompt": say})
	f = v.next()
	var trimmed struct {
		Type            string `json:"type"`
		DroppedMessages int    `json:"dropped_messages"`
		KeptTurns       int    `json:"kept_turns"`
		Reason          string `json:"reason"`
	}
	if f.Method != "session/update" || json.Unmarshal(f.Params, &trimmed) != nil || trimmed.Type != "history_trimmed" ||
		trimmed.DroppedMessages != 2 || trimmed.KeptTurns != 2 || trimmed.Reason == "" {
		t.Fatalf("first frame of the third turn: %s %s", f.Method, f.Params)
	}
	v.until(id)
	after := v.transcript(tiny)
	for i, r := range before {
		if after[i] != r {
			t.Fatalf("transcript row %d changed: %+v -> %+v", i, r, after[i])
		}
	}
}

// With PostgreSQL stopped, session/kill and session/delete answer -32603;
// the live session is kept and its rows are intact once PostgreSQL is
// back.
func TestSessionKillDeleteWhilePostgresStopped(t *testing.T) {
	t.Parallel()
	s, pg, db := durableStack(t)
	v := newConv(t, s, nil)
	id := v.newSession("")
	v.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say kept"})
	before := v.transcript(id)
	rows := sessionRows(t, db, id)

	pg.Stop()
	for _, method := range []string{"session/kill", "session/delete"} {
		_, f := v.until(v.send(method, map[string]any{"session_id": id}))
		if f.Error == nil || f.Error.Code != -32603 || !strings.Contains(f.Error.Message, "database unavailable") {
			t.Fatalf("%s with PostgreSQL stopped: %+v", method, f.Error)
		}
	}
	pg.Start()
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, f := v.until(v.send("session/state", map[string]any{"session_id": id}))
		if f.Error != nil {
			return fmt.Errorf("session/state: %s", f.Error.Message)
		}
		var st struct{ State string }
		json.Unmarshal(f.Result, &st)
		if st.State != "idle" {
			return fmt.Errorf("state %s", st.State)
		}
		return nil
	})
	db = dbConn(t, pg)
	if got := sessionRows(t, db, id); fmt.Sprint(got) != fmt.Sprint(rows) {
		t.Fatalf("rows after the outage %v, before %v", got, rows)
	}
	after := v.transcript(id)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("transcript after the outage %+v, before %+v", after, before)
	}
	var pr struct{ Content string }
	json.Unmarshal(v.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say back"}), &pr)
	if pr.Content != "back" {
		t.Fatalf("prompt after the outage: %+v", pr)
	}
	v.call("session/delete", map[string]any{"session_id": id})
}
