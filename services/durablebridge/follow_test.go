package durablebridge

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A streamed chunk of a shown pane's known turn leaves every ask as it
// was (the follower then skips its walk over the asks), anything else may
// not; and an ask still expires on time while its session streams a chunk
// a millisecond.
func TestAskExpiresWhileItsSessionStreams(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.cfg.ReconcileEvery = time.Hour
	a := testAsk("s-1", "tc-1")
	a.expires = time.Now().Add(200 * time.Millisecond)
	w.addPane("s-1", "main", 1, a) // its turn is turn-1
	f := w.b.follower

	chunk := func(seq int64) bus.Update {
		return bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: seq,
			JSON: []byte(`{"turn_id":"turn-1","text":"x"}`)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	if !f.apply(ctx, chunk(1)) {
		t.Fatal("a chunk of the known turn reported as changing asks")
	}
	trimmed := bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_HISTORY_TRIMMED, Seq: 2,
		JSON: []byte(`{"turn_id":"turn-1","dropped_messages":3}`)}
	if f.apply(ctx, trimmed) {
		t.Fatal("an update other than a chunk reported as leaving asks alone")
	}

	done := make(chan struct{})
	go func() { defer close(done); f.follow(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second) // a failure bound, not a figure
	for seq := int64(3); ; seq++ {
		select {
		case f.updates <- chunk(seq):
		case <-time.After(time.Second):
		}
		expired := false
		w.b.layout.read("s-1", func(*pane) { expired = a.expired })
		if expired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ask did not expire while chunks streamed")
		}
		time.Sleep(time.Millisecond)
	}
	var last int64
	w.b.layout.read("s-1", func(p *pane) { last = p.lastSeq })
	if last < 4 {
		t.Fatalf("chunks not applied meanwhile: last seq %d", last)
	}
}

// An update the pane already covers (queued while the pane was loaded
// from a view that includes it) is skipped: the pane is left as it was
// and no ask can have changed, so the follower does not walk the asks.
func TestCoveredUpdateIsSkipped(t *testing.T) {
	w := newWireBridge(t, false)
	w.addPane("s-1", "main", 1, testAsk("s-1", "tc-1"))
	// Loaded from a view at seq 4: update 5 follows it.
	w.b.layout.mutate("s-1", func(p *pane) bool { p.lastSeq = 4; return false })
	f := w.b.follower
	ctx := context.Background()
	chunk := func(seq int64, text string) bus.Update {
		return bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: seq,
			JSON: []byte(`{"turn_id":"turn-1","text":"` + text + `"}`)}
	}
	if !f.apply(ctx, chunk(5, "new")) {
		t.Fatal("a chunk of the known turn reported as changing asks")
	}
	reply := func() (text string, last int64) {
		w.b.layout.read("s-1", func(p *pane) {
			if it := p.itemByID["turn-1:reply"]; it != nil {
				text = string(it.text)
			}
			last = p.lastSeq
		})
		return text, last
	}
	text, last := reply()
	for _, seq := range []int64{5, 3} {
		if !f.apply(ctx, chunk(seq, "covered")) {
			t.Fatalf("update %d, already covered, reported as changing asks", seq)
		}
		if gotText, gotLast := reply(); gotText != text || gotLast != last {
			t.Fatalf("update %d, already covered, changed the pane: %q seq %d, was %q seq %d", seq, gotText, gotLast, text, last)
		}
	}
}

// pagedSessions serves a session's transcript two rows a page, and notes
// each read that comes before the pane has shown the pages it served.
type pagedSessions struct {
	sessionv1.SessionServiceClient
	layout *Layout
	rows   []*sessionv1.TranscriptMessage
	reads  int
	early  []string
}

func (s *pagedSessions) Transcript(_ context.Context, in *sessionv1.TranscriptRequest, _ ...grpc.CallOption) (*sessionv1.TranscriptResponse, error) {
	s.reads++
	from := in.GetAfterIndex() + 1
	var shown int64 = -1
	s.layout.read(in.GetSessionId(), func(p *pane) { shown = p.transcriptNext })
	if shown != from {
		s.early = append(s.early, fmt.Sprintf("read %d from row %d with the pane at row %d", s.reads, from, shown))
	}
	end := min(from+2, int64(len(s.rows)))
	return &sessionv1.TranscriptResponse{SessionId: in.GetSessionId(), Total: int64(len(s.rows)), Messages: s.rows[from:end]}, nil
}

func (s *pagedSessions) GetSessionView(context.Context, *sessionv1.GetSessionViewRequest, ...grpc.CallOption) (*sessionv1.GetSessionViewResponse, error) {
	return nil, status.Error(codes.Unavailable, "not in this test")
}

func (s *pagedSessions) add(role, content string) {
	s.rows = append(s.rows, &sessionv1.TranscriptMessage{Index: int64(len(s.rows)), Role: role, Content: content, CreatedAt: timestamppb.Now()})
}

// The rows of a turn the pane had not shown (its prompt, when the bridge
// meets the turn mid-way; at its end, what it wrote) were all read, page
// after page, before any was shown: a turn's rows could be tens of MiB
// held at once. Each page is now shown before the next is read.
func TestTurnRowsShownPageByPage(t *testing.T) {
	w := newWireBridge(t, false)
	ss := &pagedSessions{layout: w.b.layout}
	w.b.sessions = ss
	w.b.layout.put(newPane("s-1", "main", time.Now()))
	for i := range 5 {
		ss.add("user", fmt.Sprintf("prompt %d", i))
	}
	f := w.b.follower
	ctx := context.Background()

	// A chunk of a turn the pane does not know: the rows before it are
	// read and shown.
	f.apply(ctx, bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: 1,
		JSON: []byte(`{"turn_id":"turn-2","text":"partial"}`)})
	if ss.reads != 3 || len(ss.early) > 0 {
		t.Fatalf("meeting the turn: %d reads, %v", ss.reads, ss.early)
	}
	var turn, live string
	w.b.layout.read("s-1", func(p *pane) {
		if p.turn != nil {
			turn = p.turn.id
		}
		live = p.liveTurn
	})
	if turn != "turn-2" || live != "turn-2" {
		t.Fatalf("the turn met: %q, live %q", turn, live)
	}

	// The turn ends having written tool results and its reply, which its
	// updates showed, and a user's message queued meanwhile.
	for _, r := range []string{"tool", "tool", "user", "tool", "assistant"} {
		ss.add(r, r+" row")
	}
	ss.reads = 0
	f.apply(ctx, bus.Update{SessionID: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, Seq: 2,
		JSON: []byte(`{"turn_id":"turn-2","content":"the reply"}`)})
	if ss.reads != 3 || len(ss.early) > 0 {
		t.Fatalf("the turn's end: %d reads, %v", ss.reads, ss.early)
	}
	var ids []string
	w.b.layout.read("s-1", func(p *pane) {
		for _, it := range p.items {
			ids = append(ids, it.id)
		}
		turn, live = "", p.liveTurn
		if p.turn != nil {
			turn = p.turn.id
		}
	})
	if got := strings.Join(ids, ","); got != "m0,m1,m2,m3,m4,turn-2:reply,m7" || turn != "" || live != "" {
		t.Fatalf("after the turn's end: items %s, turn %q, live %q", got, turn, live)
	}
}

// holedSessions is a session service with one session, s-1, whose view
// and transcript the test sets.
type holedSessions struct {
	sessionv1.SessionServiceClient
	view  *sessionv1.SessionView
	rows  []*sessionv1.TranscriptMessage
	views int
}

func (s *holedSessions) GetSessionView(context.Context, *sessionv1.GetSessionViewRequest, ...grpc.CallOption) (*sessionv1.GetSessionViewResponse, error) {
	s.views++
	return &sessionv1.GetSessionViewResponse{View: s.view}, nil
}

func (s *holedSessions) Transcript(_ context.Context, in *sessionv1.TranscriptRequest, _ ...grpc.CallOption) (*sessionv1.TranscriptResponse, error) {
	from := int64(0)
	if in.AfterIndex != nil {
		from = in.GetAfterIndex() + 1
	}
	from = min(from, int64(len(s.rows)))
	return &sessionv1.TranscriptResponse{SessionId: in.GetSessionId(), Total: int64(len(s.rows)), Messages: s.rows[from:]}, nil
}

func (s *holedSessions) add(role, content string) {
	s.rows = append(s.rows, &sessionv1.TranscriptMessage{Index: int64(len(s.rows)), Role: role, Content: content, CreatedAt: timestamppb.Now()})
}

// Updates lost on the bus (its connection dropped and came back while
// a turn streamed) left a hole in a pane's seqs that nothing noticed:
// the next update was applied as if it followed, the reply shown cut,
// and the turn's tool call, whose update was among the lost, never
// shown (a followed turn's tool rows are its updates'), the pane
// staying so for as long as the bridge ran. A hole now has the pane
// read again from the session service, and once more at the end of
// the turn it cut, when the transcript holds all the turn wrote.
func TestHoleInUpdatesResyncsThePane(t *testing.T) {
	w := newWireBridge(t, false)
	ss := &holedSessions{}
	w.b.sessions = ss
	f := w.b.follower
	ctx := context.Background()
	running := func(seq int64, turn string) *sessionv1.SessionView {
		st := sessionv1.SessionState_SESSION_STATE_IDLE
		if turn != "" {
			st = sessionv1.SessionState_SESSION_STATE_RUNNING
		}
		return &sessionv1.SessionView{Session: &sessionv1.Session{SessionId: "s-1", AgentAlias: "main", State: st, CreatedAt: timestamppb.Now()},
			UpdateSeq: seq, TurnId: turn, TurnStartedAt: timestamppb.Now()}
	}
	ss.add("user", "the prompt")
	ss.view = running(4, "turn-1")
	if err := f.loadPane(ctx, ss.view, false); err != nil {
		t.Fatal(err)
	}
	update := func(seq int64, typ busv1.UpdateType, json string) bus.Update {
		return bus.Update{SessionID: "s-1", Type: typ, Seq: seq, JSON: []byte(json)}
	}
	chunk := func(seq int64, text string) bus.Update {
		return update(seq, busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, `{"turn_id":"turn-1","text":"`+text+`"}`)
	}
	f.apply(ctx, chunk(5, "Hel"))
	// Lost: chunk 6 "lo ", the tool call 7 and its result 8.
	f.apply(ctx, chunk(9, "world"))
	ss.view = running(9, "turn-1")
	f.reloadMarked(ctx)

	// The turn ends: its tool row and reply are in the transcript.
	ss.add("tool", "echo: ok")
	ss.add("assistant", "Hello world")
	ss.view = running(10, "")
	f.apply(ctx, update(10, busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, `{"turn_id":"turn-1","content":"Hello world"}`))
	f.reloadMarked(ctx)

	var items []string
	var last int64
	turn := "none"
	w.b.layout.read("s-1", func(p *pane) {
		for _, it := range p.items {
			items = append(items, it.kind+"="+string(it.text))
		}
		last = p.lastSeq
		if p.turn != nil {
			turn = p.turn.id
		}
	})
	got := strings.Join(items, ",")
	if !strings.Contains(got, kindTool+"=echo: ok") || strings.Count(got, "Hello world") != 1 || turn != "none" || last != 10 {
		t.Fatalf("after a turn whose updates 6 to 8 were lost: items %s, turn %s, last seq %d (%d views read)", got, turn, last, ss.views)
	}
}
