package session

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/session/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var (
	operator = &commonv1.Principal{PrincipalId: "shared-operator", Operator: true}
	alice    = &commonv1.Principal{PrincipalId: "user:alice", User: "alice"}
	bob      = &commonv1.Principal{PrincipalId: "user:bob", User: "bob"}
)

// wait is the longest any test waits for something to happen.
const wait = 15 * time.Second

// harness is a session Server on a fresh database and NATS server, with a
// NATS connection of its own for the test to listen with.
type harness struct {
	t       testing.TB
	dbURL   string
	dataDir string
	nc      *nats.Conn // the server's
	listen  *nats.Conn // the test's
	agents  *StaticAgents
	cfg     Config
	srv     *Server
	pool    *pgxpool.Pool
}

func newHarness(t testing.TB, tweak ...func(*Config)) *harness {
	t.Helper()
	return newHarnessOn(t, migratedDB(t), tweak...)
}

// migratedDB is a new database of the test's own with the session
// schema's migrations applied: a copy of one migrated once a process
// (testenv.PostgresPrepared), where each test applied all of them anew.
func migratedDB(t testing.TB) string {
	t.Helper()
	return testenv.PostgresPrepared(t, "session", func(ctx context.Context, url string) error {
		pool, err := pg.Open(ctx, url, "session", migrations.FS, zap.NewNop())
		if err != nil {
			return err
		}
		pool.Close()
		return nil
	})
}

// newHarnessOn is newHarness on the database at dbURL.
func newHarnessOn(t testing.TB, dbURL string, tweak ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, dbURL: dbURL, dataDir: t.TempDir(), agents: NewStaticAgents()}
	natsURL := testenv.NATS(t)
	var err error
	if h.nc, err = nats.Connect(natsURL); err != nil {
		t.Fatalf("nats: %v", err)
	}
	t.Cleanup(h.nc.Close)
	if h.listen, err = nats.Connect(natsURL); err != nil {
		t.Fatalf("nats: %v", err)
	}
	t.Cleanup(h.listen.Close)
	h.cfg = Config{NATS: h.nc, Log: testenv.Logger(t), DataDir: h.dataDir, Agents: h.agents, UnwindTimeout: 5 * time.Second}
	for _, f := range tweak {
		f(&h.cfg)
	}
	h.start()
	return h
}

// start opens a new pool and a new Server on the harness's database.
func (h *harness) start() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pg.Open(ctx, h.dbURL, "session", migrations.FS, h.cfg.Log)
	if err != nil {
		h.t.Fatalf("open database: %v", err)
	}
	h.pool = pool
	h.cfg.DB = pool
	srv, err := New(ctx, h.cfg)
	if err != nil {
		h.t.Fatalf("new server: %v", err)
	}
	h.srv = srv
	h.t.Cleanup(func() { srv.Shutdown(); pool.Close() })
}

// restart stops the Server and builds a new one on the same database, as
// a restart of the process would.
func (h *harness) restart() {
	h.t.Helper()
	h.srv.Shutdown()
	h.pool.Close()
	h.start()
}

// crash stands for a SIGKILL of the service: the running Server is cut
// off from the database and the bus at once (nothing it does afterwards
// reaches either), and a new one starts on the same database, as the
// restarted process would.
func (h *harness) crash() {
	h.t.Helper()
	url := h.nc.ConnectedUrl()
	h.pool.Close()
	h.nc.Close()
	nc, err := nats.Connect(url)
	if err != nil {
		h.t.Fatalf("nats: %v", err)
	}
	h.t.Cleanup(nc.Close)
	h.nc, h.cfg.NATS = nc, nc
	h.start()
}

func (h *harness) newSession(p *commonv1.Principal, alias string) string {
	h.t.Helper()
	resp, err := h.srv.NewSession(context.Background(), &sessionv1.NewSessionRequest{Principal: p, AgentAlias: alias})
	if err != nil {
		h.t.Fatalf("new session: %v", err)
	}
	return resp.GetSessionId()
}

type promptResult struct {
	resp *sessionv1.PromptResponse
	err  error
}

// promptAsync runs Prompt in a goroutine the test waits for at cleanup.
func (h *harness) promptAsync(ctx context.Context, req *sessionv1.PromptRequest) <-chan promptResult {
	ch := make(chan promptResult, 1)
	srv := h.srv
	go func() {
		resp, err := srv.Prompt(ctx, req)
		ch <- promptResult{resp, err}
	}()
	return ch
}

func (h *harness) prompt(p *commonv1.Principal, id, text string) *sessionv1.PromptResponse {
	h.t.Helper()
	return h.promptWithin(p, id, text, wait)
}

// promptWithin is prompt with a bound of its own, for a turn whose work
// is many times an ordinary one's. Its end cancels the turn, as a
// client's leaving would.
func (h *harness) promptWithin(p *commonv1.Principal, id, text string, bound time.Duration) *sessionv1.PromptResponse {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	resp, err := h.srv.Prompt(ctx, &sessionv1.PromptRequest{Principal: p, SessionId: id, Prompt: text})
	if err != nil {
		h.t.Fatalf("prompt: %v", err)
	}
	return resp
}

func (h *harness) state(p *commonv1.Principal, id string) string {
	h.t.Helper()
	st, err := h.srv.State(context.Background(), &sessionv1.StateRequest{Principal: p, SessionId: id})
	if err != nil {
		h.t.Fatalf("state: %v", err)
	}
	return stateWord(st.GetState())
}

// stateWord, decisionOf and surfaceOf translate the contract's enums to
// the words the tests read.
func stateWord(st sessionv1.SessionState) string {
	for w, e := range stateEnum {
		if e == st {
			return w
		}
	}
	return ""
}

func decisionOf(word string) sessionv1.Decision {
	for e, w := range decisionWords {
		if w == word {
			return e
		}
	}
	return sessionv1.Decision_DECISION_UNSPECIFIED
}

func surfaceOf(word string) sessionv1.Surface {
	for e, w := range surfaceWords {
		if w == word {
			return e
		}
	}
	return sessionv1.Surface_SURFACE_UNSPECIFIED
}

// update is one received session update with its params decoded.
type update struct {
	Seq    int64
	Type   string
	Params map[string]any
}

func (u update) str(k string) string { s, _ := u.Params[k].(string); return s }

// recorder collects the updates of one session as a gateway would.
type recorder struct {
	t   testing.TB
	sub *nats.Subscription
	ch  chan *nats.Msg
}

// reuseHeld deletes session id while its live entry is held, and makes a
// new session under the id while that entry is still in memory (Delete
// forgets it only once released, a holder keeps it longer, a turn may
// outlive the rows): it returns the deleted session's row and entry, the
// hold's release, and the new session's row, of a later incarnation.
func (h *harness) reuseHeld(p *commonv1.Principal, id string) (old sessionRow, oldLive *liveSession, release func(), cur sessionRow) {
	h.t.Helper()
	ctx := context.Background()
	old, err := h.srv.store.session(ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	oldLive, release = h.srv.hold(ctx, old)
	if _, err := h.srv.Delete(ctx, &sessionv1.DeleteRequest{Principal: p, SessionId: id}); err != nil {
		h.t.Fatal(err)
	}
	h.srv.mu.Lock()
	h.srv.lives[id] = oldLive
	h.srv.mu.Unlock()
	if _, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: p, SessionId: id}); err != nil {
		h.t.Fatal(err)
	}
	cur, err = h.srv.store.session(ctx, id)
	if err != nil || cur.Incarnation <= old.Incarnation {
		h.t.Fatalf("the new session's row %+v %v, the deleted one's incarnation %d", cur, err, old.Incarnation)
	}
	return old, oldLive, release, cur
}

// incarnation is the stored session id's incarnation now.
func (h *harness) incarnation(id string) int64 {
	h.t.Helper()
	var incarnation int64
	if err := h.pool.QueryRow(context.Background(), "SELECT incarnation FROM sessions WHERE session_id = $1", id).Scan(&incarnation); err != nil {
		h.t.Fatalf("incarnation of %s: %v", id, err)
	}
	return incarnation
}

// subject is the update subject of the stored session id, of its
// incarnation now.
func (h *harness) subject(id string) string {
	h.t.Helper()
	subject, err := bus.SessionUpdateSubject(id, h.incarnation(id))
	if err != nil {
		h.t.Fatal(err)
	}
	return subject
}

func (h *harness) record(id string) *recorder {
	h.t.Helper()
	r := &recorder{t: h.t, ch: make(chan *nats.Msg, 4096)}
	var err error
	if r.sub, err = h.listen.ChanSubscribe(h.subject(id), r.ch); err != nil {
		h.t.Fatalf("subscribe: %v", err)
	}
	if err := h.listen.Flush(); err != nil {
		h.t.Fatalf("flush: %v", err)
	}
	h.t.Cleanup(func() { _ = r.sub.Unsubscribe() })
	return r
}

// next is the next update a client would see: a turn's start, for
// gateways alone, is skipped.
func (r *recorder) next() update {
	r.t.Helper()
	for {
		u := r.nextOnBus()
		if u.GetType() != busv1.UpdateType_UPDATE_TYPE_TURN_STARTED {
			return r.decode(u)
		}
	}
}

// nextOnBus is the next message on the session's subject.
func (r *recorder) nextOnBus() *busv1.SessionUpdate {
	r.t.Helper()
	select {
	case m := <-r.ch:
		u := &busv1.SessionUpdate{}
		if err := proto.Unmarshal(m.Data, u); err != nil {
			r.t.Fatalf("decode: %v", err)
		}
		return u
	case <-time.After(wait):
		r.t.Fatalf("no update after %v", wait)
		panic("unreachable")
	}
}

// decode checks a client's update and decodes its params.
func (r *recorder) decode(u *busv1.SessionUpdate) update {
	r.t.Helper()
	var params map[string]any
	if err := json.Unmarshal([]byte(u.GetJson()), &params); err != nil {
		r.t.Fatalf("update json %q: %v", u.GetJson(), err)
	}
	if params["type"] != bus.UpdateTypeName(u.GetType()) || params["session_id"] != u.GetSessionId() || params["sessionId"] != u.GetSessionId() {
		r.t.Fatalf("update params %v disagree with the envelope %v", params, u)
	}
	if u.GetConnectionId() != "" {
		r.t.Fatalf("update addressed to a connection: %v", u)
	}
	return update{Seq: u.GetSeq(), Type: bus.UpdateTypeName(u.GetType()), Params: params}
}

// until collects updates up to and including the first of type typ.
func (r *recorder) until(typ string) []update {
	r.t.Helper()
	var out []update
	for {
		u := r.next()
		out = append(out, u)
		if u.Type == typ {
			return out
		}
	}
}

// quiet fails if another update arrives within a short while; used after
// turn_complete to prove it was the last one. Absence can only be checked
// for a while: this is not a timing assertion on the service.
func (r *recorder) quiet(d time.Duration) {
	r.t.Helper()
	select {
	case m := <-r.ch:
		u := &busv1.SessionUpdate{}
		_ = proto.Unmarshal(m.Data, u)
		r.t.Fatalf("unexpected update %s: %s", u.GetType(), u.GetJson())
	case <-time.After(d):
	}
}

// checkSeq fails unless the updates' seq numbers follow each other.
func checkSeq(t testing.TB, us []update) {
	t.Helper()
	for i := 1; i < len(us); i++ {
		if us[i].Seq != us[i-1].Seq+1 {
			t.Fatalf("seq %d follows %d", us[i].Seq, us[i-1].Seq)
		}
	}
}

func types(us []update) string {
	var b strings.Builder
	for i, u := range us {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(u.Type)
	}
	return b.String()
}

func texts(us []update, typ string) []string {
	var out []string
	for _, u := range us {
		if u.Type == typ {
			out = append(out, u.str("text"))
		}
	}
	return out
}

// wantRefusal fails unless err is a status with code and reason.
func wantRefusal(t testing.TB, err error, code codes.Code, reason, msgPart string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || err == nil {
		t.Fatalf("want %v %s, got %v", code, reason, err)
	}
	got, _ := rpcerr.Details(st)
	if st.Code() != code || got != reason || !strings.Contains(st.Message(), msgPart) {
		t.Fatalf("want %v %s %q, got %v %s %q", code, reason, msgPart, st.Code(), got, st.Message())
	}
}

// eventually polls fn until it returns nil.
func eventually(t testing.TB, fn func() error) {
	t.Helper()
	testenv.Eventually(t, wait, 10*time.Millisecond, fn)
}
