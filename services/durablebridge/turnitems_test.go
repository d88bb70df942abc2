package durablebridge

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// historySessions is a session service whose sessions' views, transcripts
// and turn events the test sets.
type historySessions struct {
	sessionv1.SessionServiceClient
	views  map[string]*sessionv1.SessionView
	rows   map[string][]*sessionv1.TranscriptMessage
	events map[string][]*sessionv1.TurnEvent
	ended  map[string]string // turn id: content
	// trims are the trims of turns, given for the turns without events.
	trims map[string]int64
}

func (s *historySessions) GetSessionView(_ context.Context, in *sessionv1.GetSessionViewRequest, _ ...grpc.CallOption) (*sessionv1.GetSessionViewResponse, error) {
	v := s.views[in.GetSessionId()]
	if v == nil {
		return nil, status.Error(codes.NotFound, "no such session")
	}
	return &sessionv1.GetSessionViewResponse{View: v}, nil
}

func (s *historySessions) Transcript(_ context.Context, in *sessionv1.TranscriptRequest, _ ...grpc.CallOption) (*sessionv1.TranscriptResponse, error) {
	rows := s.rows[in.GetSessionId()]
	from := int64(0)
	if in.AfterIndex != nil {
		from = min(in.GetAfterIndex()+1, int64(len(rows)))
	}
	return &sessionv1.TranscriptResponse{SessionId: in.GetSessionId(), Total: int64(len(rows)), Messages: rows[from:]}, nil
}

func (s *historySessions) TurnEvents(_ context.Context, in *sessionv1.TurnEventsRequest, _ ...grpc.CallOption) (*sessionv1.TurnEventsResponse, error) {
	resp := &sessionv1.TurnEventsResponse{}
	for _, id := range in.GetTurnIds() {
		if evs, ok := s.events[id]; ok {
			content, ended := s.ended[id]
			resp.Turns = append(resp.Turns, &sessionv1.TurnShown{TurnId: id, Events: evs, Ended: ended, Content: content})
		} else if n := s.trims[id]; n > 0 {
			resp.Trims = append(resp.Trims, &sessionv1.TurnTrim{TurnId: id, TrimmedMessages: n, TrimmedAt: timestamppb.Now()})
		}
	}
	return resp, nil
}

func (s *historySessions) add(session, turn, role, content string) {
	s.rows[session] = append(s.rows[session], &sessionv1.TranscriptMessage{Index: int64(len(s.rows[session])), Role: role, Content: content,
		CreatedAt: timestamppb.Now(), TurnId: turn})
}

func (s *historySessions) view(session, turn string, seq int64) {
	st := sessionv1.SessionState_SESSION_STATE_IDLE
	if turn != "" {
		st = sessionv1.SessionState_SESSION_STATE_RUNNING
	}
	s.views[session] = &sessionv1.SessionView{Session: &sessionv1.Session{SessionId: session, AgentAlias: "main", State: st, CreatedAt: timestamppb.Now()},
		UpdateSeq: seq, TurnId: turn, TurnStartedAt: timestamppb.Now()}
}

// paneItems is a pane's items as a phone shows them: kind and text.
func paneItems(l *Layout, id string) string {
	var out []string
	l.read(id, func(p *pane) {
		for _, it := range p.items {
			out = append(out, fmt.Sprintf("%s %q", it.kind, it.text))
		}
	})
	return strings.Join(out, "\n")
}

// A turn that thinks, says a first part, calls a tool, thinks again and
// says the rest shows the same in a pane that followed its updates, in a
// pane built from the session's history after it, and in one built from
// it in the middle and followed to its end: the prompt, the thoughts, the
// reply once, the tool with its result. Built from the transcript, the
// pane had no thinking item, and the one built mid-turn showed the first
// part twice, as the transcript's row and in the reply its updates grew;
// the follower itself showed that row too when it met the turn after the
// turn had written it.
func TestPaneBuiltFromHistoryShowsTheTurnAsFollowed(t *testing.T) {
	w := newWireBridge(t, false)
	ss := &historySessions{views: map[string]*sessionv1.SessionView{}, rows: map[string][]*sessionv1.TranscriptMessage{},
		events: map[string][]*sessionv1.TurnEvent{}, ended: map[string]string{}}
	w.b.sessions = ss
	f := w.b.follower
	ctx := context.Background()

	const prompt = "/think weighing\n/say first\n/tool echo {}\n/think again\n/say last"
	thought := func(text string) *sessionv1.TurnEvent { return &sessionv1.TurnEvent{Kind: "thought", Text: text} }
	text := func(text string) *sessionv1.TurnEvent { return &sessionv1.TurnEvent{Kind: "text", Text: text} }
	call := &sessionv1.TurnEvent{Kind: "tool_call", ToolCallId: "tc_1", Name: "echo", Text: `{ "x": 1 }`}
	result := &sessionv1.TurnEvent{Kind: "tool_result", ToolCallId: "tc_1", Name: "echo", Status: "completed", Text: `{"x":1}`}
	updates := []struct {
		typ  busv1.UpdateType
		json string
	}{
		{busv1.UpdateType_UPDATE_TYPE_AGENT_THOUGHT_CHUNK, `{"turn_id":"T","text":"weighing"}`},
		{busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, `{"turn_id":"T","text":"first"}`},
		{busv1.UpdateType_UPDATE_TYPE_TOOL_CALL, `{"turn_id":"T","tool_call_id":"tc_1","name":"echo","raw_input":{"x":1}}`},
		{busv1.UpdateType_UPDATE_TYPE_TOOL_RESULT, `{"turn_id":"T","tool_call_id":"tc_1","name":"echo","status":"completed","raw_output":"{\"x\":1}"}`},
		{busv1.UpdateType_UPDATE_TYPE_AGENT_THOUGHT_CHUNK, `{"turn_id":"T","text":"again"}`},
		{busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, `{"turn_id":"T","text":"\nlast"}`},
		{busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, `{"turn_id":"T","content":"first\nlast"}`},
	}
	// follow applies updates from on; the turn's last reply row is
	// written before its end is published.
	follow := func(session string, from int) {
		for i := from; i < len(updates); i++ {
			if i == len(updates)-1 {
				ss.add(session, "T", "assistant", "\nlast")
			}
			u := updates[i]
			f.apply(ctx, bus.Update{SessionID: session, Type: u.typ, Seq: int64(i + 1), Incarnation: 0, JSON: []byte(u.json)})
		}
	}
	// The turn's rows up to its tool's result, then its last reply row.
	midRows := func(session string) {
		ss.add(session, "T", "user", prompt)
		ss.add(session, "T", "assistant", "first")
		ss.add(session, "T", "tool", "echo: {\"x\":1}")
	}

	// Followed from its start: the bridge meets the turn once it has
	// written the text said before its tool call.
	ss.view("followed", "", 0)
	if err := f.loadPane(ctx, ss.views["followed"], false); err != nil {
		t.Fatal(err)
	}
	midRows("followed")
	ss.view("followed", "T", 4)
	follow("followed", 0)
	want := paneItems(w.b.layout, "followed")
	if want != `user "`+strings.ReplaceAll(prompt, "\n", `\n`)+`"`+"\n"+`thinking "weighingagain"`+"\n"+`reply "first\nlast"`+"\n"+`tool "echo {\"x\":1}\ncompleted: {\"x\":1}"` {
		t.Fatalf("the followed pane:\n%s", want)
	}

	// Built from the history once the turn ended.
	midRows("ended")
	ss.add("ended", "T", "assistant", "\nlast")
	ss.events["T"] = []*sessionv1.TurnEvent{thought("weighing"), text("first"), call, result, thought("again"), text("\nlast")}
	ss.ended["T"] = "first\nlast"
	ss.view("ended", "", 7)
	if err := f.loadPane(ctx, ss.views["ended"], false); err != nil {
		t.Fatal(err)
	}
	if got := paneItems(w.b.layout, "ended"); got != want {
		t.Fatalf("built after the turn:\n%s\nfollowed:\n%s", got, want)
	}

	// Built in the middle of the turn, its events read with its tool's
	// result and its view from before it (update 4, applied again), then
	// followed to its end.
	midRows("running")
	ss.events["T"] = []*sessionv1.TurnEvent{thought("weighing"), text("first"), call, result}
	delete(ss.ended, "T")
	ss.view("running", "T", 3)
	if err := f.loadPane(ctx, ss.views["running"], false); err != nil {
		t.Fatal(err)
	}
	follow("running", 3)
	if got := paneItems(w.b.layout, "running"); got != want {
		t.Fatalf("built mid-turn and followed:\n%s\nfollowed:\n%s", got, want)
	}
}

// A turn whose start trimmed the context and whose events the session
// does not give (past 4 MiB, or from before they were kept) is built
// from its rows: it came back without the trim's notice its follower
// showed after its prompt. The session now names such turns' trims, and
// the pane built shows the notice where the follower did.
func TestPaneBuiltFromRowsKeepsTheTurnsTrimNotice(t *testing.T) {
	w := newWireBridge(t, false)
	ss := &historySessions{views: map[string]*sessionv1.SessionView{}, rows: map[string][]*sessionv1.TranscriptMessage{},
		events: map[string][]*sessionv1.TurnEvent{}, ended: map[string]string{}, trims: map[string]int64{"T": 5}}
	w.b.sessions = ss
	f := w.b.follower
	ctx := context.Background()

	ss.view("followed", "", 0)
	if err := f.loadPane(ctx, ss.views["followed"], false); err != nil {
		t.Fatal(err)
	}
	ss.add("followed", "T", "user", "go on")
	ss.view("followed", "T", 0)
	for i, u := range []struct {
		typ  busv1.UpdateType
		json string
	}{
		{busv1.UpdateType_UPDATE_TYPE_HISTORY_TRIMMED, `{"turn_id":"T","dropped_messages":5}`},
		{busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, `{"turn_id":"T","text":"done"}`},
		{busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, `{"turn_id":"T","content":"done"}`},
	} {
		if u.typ == busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE {
			ss.add("followed", "T", "assistant", "done")
		}
		f.apply(ctx, bus.Update{SessionID: "followed", Type: u.typ, Seq: int64(i + 1), JSON: []byte(u.json)})
	}
	want := paneItems(w.b.layout, "followed")
	if want != "user \"go on\"\nnotice \"Older history was trimmed (5 messages)\"\nreply \"done\"" {
		t.Fatalf("the followed pane:\n%s", want)
	}

	ss.add("built", "T", "user", "go on")
	ss.add("built", "T", "assistant", "done")
	ss.view("built", "", 3)
	if err := f.loadPane(ctx, ss.views["built"], false); err != nil {
		t.Fatal(err)
	}
	if got := paneItems(w.b.layout, "built"); got != want {
		t.Fatalf("built from the rows:\n%s\nfollowed:\n%s", got, want)
	}
}
