package durablebridge

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// reusedSessions is a session service holding one session id, "s-1",
// whose session can be deleted and made again (a new incarnation, its
// updates counted from 0 again). StartTurn refuses another incarnation
// than the one named, as the session service does, and records the turns
// it starts.
type reusedSessions struct {
	sessionv1.SessionServiceClient

	mu          sync.Mutex
	incarnation int64
	rows        []string
	started     []string
}

// replace deletes the session and makes another under its id.
func (s *reusedSessions) replace(incarnation int64, rows ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.incarnation, s.rows = incarnation, rows
}

func (s *reusedSessions) view() *sessionv1.SessionView {
	return &sessionv1.SessionView{
		Session:     &sessionv1.Session{SessionId: "s-1", AgentAlias: "main", State: sessionv1.SessionState_SESSION_STATE_IDLE, CreatedAt: timestamppb.Now()},
		Incarnation: s.incarnation,
	}
}

func (s *reusedSessions) ListSessionViews(context.Context, *sessionv1.ListSessionViewsRequest, ...grpc.CallOption) (*sessionv1.ListSessionViewsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &sessionv1.ListSessionViewsResponse{Views: []*sessionv1.SessionView{s.view()}}, nil
}

func (s *reusedSessions) GetSessionView(context.Context, *sessionv1.GetSessionViewRequest, ...grpc.CallOption) (*sessionv1.GetSessionViewResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &sessionv1.GetSessionViewResponse{View: s.view()}, nil
}

func (s *reusedSessions) Transcript(_ context.Context, in *sessionv1.TranscriptRequest, _ ...grpc.CallOption) (*sessionv1.TranscriptResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &sessionv1.TranscriptResponse{SessionId: "s-1", Total: int64(len(s.rows))}
	from := int64(0) // without after_index, the tail: every row here
	if in.AfterIndex != nil {
		from = in.GetAfterIndex() + 1
	}
	for i := from; i < int64(len(s.rows)); i++ {
		resp.Messages = append(resp.Messages, &sessionv1.TranscriptMessage{Index: i, Role: "user", Content: s.rows[i], CreatedAt: timestamppb.Now()})
	}
	return resp, nil
}

func (s *reusedSessions) StartTurn(_ context.Context, in *sessionv1.StartTurnRequest, _ ...grpc.CallOption) (*sessionv1.StartTurnResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := in.GetIncarnation(); n != 0 && n != s.incarnation {
		return nil, status.Error(codes.NotFound, "session not found")
	}
	s.started = append(s.started, in.GetPrompt())
	return &sessionv1.StartTurnResponse{SessionId: "s-1", TurnId: fmt.Sprintf("turn-%d", len(s.started))}, nil
}

func (s *reusedSessions) turns() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.started...)
}

// A session id deleted and made again names another session. The bridge
// followed updates by id alone: a deleted session's late updates (the bus
// delivers them after the follower may have shown the new session, from
// a reconcile or a view) were shown in the new session's pane, its late
// deletion removed the new pane and forgot the texts queued for it, and
// a text typed for the deleted session started a turn in the new one.
// Each update now names its incarnation, as the pane does.
func TestUpdatesOfAReplacedIncarnation(t *testing.T) {
	w := newWireBridge(t, true)
	ss := &reusedSessions{}
	w.b.sessions = ss
	f := w.b.follower
	ctx := context.Background()
	update := func(incarnation, seq int64, typ busv1.UpdateType, json string) bus.Update {
		return bus.Update{SessionID: "s-1", Incarnation: incarnation, Type: typ, Seq: seq, JSON: []byte(json)}
	}
	chunk := func(incarnation, seq int64, turn, text string) bus.Update {
		return update(incarnation, seq, busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, `{"turn_id":"`+turn+`","text":"`+text+`"}`)
	}
	deleted := func(incarnation, seq int64) bus.Update {
		return update(incarnation, seq, busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED, `{}`)
	}
	shown := func() (incarnation int64, items string) {
		var ids []string
		if !w.b.layout.read("s-1", func(p *pane) {
			incarnation = p.incarnation
			for _, it := range p.items {
				ids = append(ids, it.id+"="+string(it.text))
			}
		}) {
			return -1, ""
		}
		return incarnation, strings.Join(ids, ",")
	}
	queued := func() []string {
		var out []string
		rows, err := w.b.store.db.Query(ctx, "SELECT incarnation, body FROM queued_sends ORDER BY seq")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var n int64
			var body string
			if err := rows.Scan(&n, &body); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%d:%s", n, body))
		}
		return out
	}

	// The first session, shown, with a text waiting for its next turn.
	ss.replace(1, "first prompt")
	f.reconcile(ctx)
	if inc, items := shown(); inc != 1 || items != "m0=first prompt" {
		t.Fatalf("the first session shown as incarnation %d: %s", inc, items)
	}
	f.apply(ctx, chunk(1, 7, "turn-a", "first reply"))
	if code, body := w.b.enqueue(ctx, "s-1", 1, "for the first"); code != 200 {
		t.Fatalf("queue: %d %v", code, body)
	}

	// It is deleted and another made under its id; the deletion is still
	// on its way when the follower lists the sessions.
	ss.replace(2, "second prompt")
	f.reconcile(ctx)
	if inc, items := shown(); inc != 2 || items != "m0=second prompt" {
		t.Fatalf("after the id was reused: incarnation %d shown: %s", inc, items)
	}
	if code, body := w.b.enqueue(ctx, "s-1", 2, "for the second"); code != 200 {
		t.Fatalf("queue: %d %v", code, body)
	}
	// The deleted session's last updates arrive: its seq is past the new
	// session's, which counts from 0.
	f.apply(ctx, chunk(1, 8, "turn-a", " more"))
	f.apply(ctx, deleted(1, 9))
	if inc, items := shown(); inc != 2 || items != "m0=second prompt" {
		t.Fatalf("the deleted session's late updates: incarnation %d shown: %s", inc, items)
	}
	if got := strings.Join(queued(), "|"); got != "1:for the first|2:for the second" {
		t.Fatalf("queued after the late deletion: %s", got)
	}
	// The new session's own updates are shown.
	f.apply(ctx, chunk(2, 1, "turn-b", "second reply"))
	if _, items := shown(); items != "m0=second prompt,turn-b:reply=second reply" {
		t.Fatalf("the new session's chunk: %s", items)
	}

	// The texts: the one typed for the deleted session never runs in the
	// new one; the new one's runs.
	f.apply(ctx, update(2, 2, busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, `{"turn_id":"turn-b"}`))
	f.drainQueues(ctx)
	f.drainQueues(ctx)
	if got := strings.Join(ss.turns(), "|"); got != "for the second" {
		t.Fatalf("turns started from the queue: %q", got)
	}
	if got := queued(); len(got) != 0 {
		t.Fatalf("left queued: %v", got)
	}

	// A text sent to the pane names the session it shows.
	ss.replace(3, "third prompt")
	if code, body := (&sendCmd{pane: "s-1", text: "for the second, late"}).run(ctx, w.b, overSocket); code != 404 {
		t.Fatalf("a text for a replaced session: %d %v", code, body)
	}
	if code, body := (&sendCmd{pane: "s-1", text: "for the second's next turn", turn: "turn-b"}).run(ctx, w.b, overSocket); code != 404 {
		t.Fatalf("a text for a replaced session's next turn: %d %v", code, body)
	}
	if got := strings.Join(ss.turns(), "|"); got != "for the second" || len(queued()) != 0 {
		t.Fatalf("after texts for a replaced session: turns %q, queued %v", got, queued())
	}

	// The second session's deletion is lost (at the queue's bound): the
	// third session's first update shows the third session in its place.
	f.apply(ctx, chunk(3, 1, "turn-c", "third reply"))
	f.apply(ctx, chunk(3, 2, "turn-c", " more"))
	f.reloadMarked(ctx)
	if inc, items := shown(); inc != 3 || !strings.HasPrefix(items, "m0=third prompt") || strings.Contains(items, "second") {
		t.Fatalf("an update of a later incarnation: incarnation %d shown: %s", inc, items)
	}
	// And its own deletion removes it.
	f.apply(ctx, deleted(3, 2))
	if inc, _ := shown(); inc != -1 {
		t.Fatalf("the pane of a deleted session stays, incarnation %d", inc)
	}
}

// poisonSessions refuses, as the session service would, a prompt it can
// never run.
type poisonSessions struct{ *reusedSessions }

func (s poisonSessions) StartTurn(ctx context.Context, in *sessionv1.StartTurnRequest, opts ...grpc.CallOption) (*sessionv1.StartTurnResponse, error) {
	if in.GetPrompt() == "poison" {
		return nil, status.Error(codes.InvalidArgument, "`prompt` is required")
	}
	return s.reusedSessions.StartTurn(ctx, in, opts...)
}

// A queued text the session service refuses as invalid can never run:
// the drain kept it at the head of its pane's queue for ever, retrying it
// at every drain, and every text queued after it waited behind it until
// the queue filled. It is dropped, as a text for a session that is gone.
func TestQueuedTextRefusedAsInvalidIsDropped(t *testing.T) {
	w := newWireBridge(t, true)
	ss := &reusedSessions{}
	w.b.sessions = poisonSessions{ss}
	f := w.b.follower
	ctx := context.Background()
	ss.replace(1, "first prompt")
	f.reconcile(ctx)
	for _, text := range []string{"poison", "after it"} {
		if code, body := w.b.enqueue(ctx, "s-1", 1, text); code != 200 {
			t.Fatalf("queue %q: %d %v", text, code, body)
		}
	}
	for range 3 {
		f.drainQueues(ctx)
	}
	if got := strings.Join(ss.turns(), "|"); got != "after it" {
		t.Fatalf("turns started from the queue: %q, want the text after the refused one", got)
	}
	var left int
	if err := w.b.store.db.QueryRow(ctx, "SELECT count(*) FROM queued_sends").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d texts left queued", left)
	}
}
