package session

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Sessions, the transcript and tool calls live in PostgreSQL: a new
// Server on the same database (a restart) lists and reads them, the
// update sequence goes on without a gap or a repeat, and turns run.
func TestPersistenceAcrossRestart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	other := h.newSession(bob, "default")
	rec := h.record(id)
	h.prompt(alice, id, "/say one\n/tool echo {\"n\":1}")
	h.prompt(alice, id, "/say two")
	if _, err := h.srv.Close(ctx, &sessionv1.CloseRequest{Principal: bob, SessionId: other}); err != nil {
		t.Fatal(err)
	}
	before, err := h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	rec.until(UpdateTurnComplete)
	last := rec.until(UpdateTurnComplete)

	h.restart()

	after, err := h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
	if err != nil || after.GetTotal() != before.GetTotal() || len(after.GetMessages()) != len(before.GetMessages()) {
		t.Fatalf("messages after restart: %v %v (before %v)", after, err, before)
	}
	for i, m := range after.GetMessages() {
		b := before.GetMessages()[i]
		if m.GetIndex() != int64(i) || m.GetIndex() != b.GetIndex() || m.GetRole() != b.GetRole() || m.GetContent() != b.GetContent() {
			t.Fatalf("message %d changed: %v -> %v", i, b, m)
		}
	}
	list, err := h.srv.List(ctx, &sessionv1.ListRequest{Principal: operator, IncludeClosed: true})
	if err != nil || len(list.GetSessions()) != 2 {
		t.Fatalf("list after restart: %v %v", list, err)
	}
	for _, s := range list.GetSessions() {
		want := map[string]string{id: stateIdle, other: stateClosed}[s.GetSessionId()]
		if stateWord(s.GetState()) != want {
			t.Fatalf("session %s is %s, want %s", s.GetSessionId(), stateWord(s.GetState()), want)
		}
	}
	var calls int
	if err := h.pool.QueryRow(ctx, "SELECT count(*) FROM tool_calls WHERE session_id = $1 AND status = 'completed'", id).Scan(&calls); err != nil || calls != 1 {
		t.Fatalf("%d tool calls after restart (%v)", calls, err)
	}

	h.prompt(alice, id, "/say three")
	next := rec.until(UpdateTurnComplete)
	if next[0].Seq != last[len(last)-1].Seq+1 {
		t.Fatalf("seq after a clean restart: %d follows %d", next[0].Seq, last[len(last)-1].Seq)
	}

	// Paging: the last two rows before index 4, oldest first.
	page, err := h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id, Limit: 2, BeforeIndex: ptr(int64(4))})
	if err != nil || page.GetTotal() != 7 || len(page.GetMessages()) != 2 || page.GetMessages()[0].GetIndex() != 2 || page.GetMessages()[1].GetIndex() != 3 {
		t.Fatalf("page %v %v", page, err)
	}
}

func ptr[T any](v T) *T { return &v }

// A turn left running by a process that died gets, at the next start, a
// visible interruption marker and its one turn_complete (cancelled), with
// a seq above anything the dead process could have used.
func TestInterruptedTurnRecovered(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	rec := h.record(id)
	h.prompt(alice, id, "/say before")
	us := rec.until(UpdateTurnComplete)
	lastSeq := us[len(us)-1].Seq

	// What a crash mid-turn leaves behind: a running turn, a running
	// session, the user's prompt, and no clean stop.
	gen := int64(3)
	if _, err := h.srv.store.beginTurn(ctx, turnStart{SessionID: id, TurnID: "turn_dead", ConnID: "conn-x", Surface: SurfaceRPC,
		Prompt: "/sleep 60000", Generation: &gen}); err != nil {
		t.Fatal(err)
	}
	srv2, err := New(ctx, h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Shutdown)

	u := rec.next()
	if u.Type != UpdateTurnComplete || u.str("turn_id") != "turn_dead" || u.str("outcome") != OutcomeCancelled ||
		u.Params["client_turn_generation"] != float64(3) || u.Seq <= lastSeq {
		t.Fatalf("recovery update %d %v (last seq %d)", u.Seq, u.Params, lastSeq)
	}
	st, err := srv2.State(ctx, &sessionv1.StateRequest{Principal: alice, SessionId: id})
	if err != nil || st.GetState() != stateEnum[stateIdle] {
		t.Fatalf("state %v %v", st, err)
	}
	msgs, _ := srv2.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
	if n := len(msgs.GetMessages()); msgs.GetMessages()[n-1].GetContent() != interruptedMarker {
		t.Fatalf("transcript %v", msgs.GetMessages())
	}
	resp, err := srv2.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say after"})
	if err != nil || resp.GetContent() != "after" {
		t.Fatalf("prompt after recovery %v %v", resp, err)
	}
}

// Over a real gRPC connection refusals keep their reason, and a turn runs.
func TestOverGRPC(t *testing.T) {
	h := newHarness(t)
	gs := grpcserver.New(testenv.Logger(t), 0)
	sessionv1.RegisterSessionServiceServer(gs.GRPC, h.srv)
	sock := filepath.Join(t.TempDir(), "session.sock")
	lis, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-served })
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := sessionv1.NewSessionServiceClient(cc)

	_, err = client.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: "sess_none", Prompt: "hi"})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, "Session sess_none not found")
	if we := errmap.ToWire("session", err); we.Code != jsonrpc.CodeSessionNotFound {
		t.Fatalf("wire error %v", we)
	}
	created, err := client.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "default"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Prompt(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: created.GetSessionId(), Prompt: "/say over grpc"})
	if err != nil || resp.GetContent() != "over grpc" || resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("prompt %v %v", resp, err)
	}
	_, err = client.StoreFile(ctx, &sessionv1.StoreFileRequest{})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "`principal` is required")
}
