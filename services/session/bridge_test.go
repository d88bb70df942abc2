package session

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// pendingOf waits until the session has one pending approval and returns
// its view.
func pendingOf(t *testing.T, h *harness, id string) *sessionv1.ApprovalView {
	t.Helper()
	var got *sessionv1.ApprovalView
	eventually(t, func() error {
		v, err := h.srv.GetSessionView(context.Background(), &sessionv1.GetSessionViewRequest{Principal: operator, SessionId: id})
		if err != nil {
			return err
		}
		if len(v.GetView().GetApprovals()) != 1 {
			return fmt.Errorf("%d pending approvals", len(v.GetView().GetApprovals()))
		}
		got = v.GetView().GetApprovals()[0]
		return nil
	})
	return got
}

func approvalOf(t *testing.T, h *harness, id, reqID string) *sessionv1.ApprovalView {
	t.Helper()
	resp, err := h.srv.GetApproval(context.Background(), &sessionv1.GetApprovalRequest{Principal: operator, SessionId: id, RequestId: reqID})
	if err != nil {
		t.Fatalf("get approval: %v", err)
	}
	return resp.GetApproval()
}

// The bridge's view of a pending approval carries the call (tool, full
// arguments, tool call id) and its expiry; a durable decision is the one
// reported afterwards, with its surface.
func TestBridgeApprovalViews(t *testing.T) {
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}, ApprovalTimeout: 30 * time.Second}})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "hasty", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}, ApprovalTimeout: 300 * time.Millisecond}})
	id := h.newSession(alice, "guarded")
	rec := h.record(id)

	before := time.Now()
	started, err := h.srv.StartTurn(context.Background(), &sessionv1.StartTurnRequest{Principal: operator, SessionId: id, Prompt: `/tool echo {"text":"hi","n":2}` + "\n/say done"})
	if err != nil || started.GetTurnId() == "" {
		t.Fatalf("start turn: %v %v", started, err)
	}
	a := pendingOf(t, h, id)
	var args map[string]any
	if err := json.Unmarshal([]byte(a.GetArgumentsJson()), &args); err != nil || args["text"] != "hi" || args["n"] != float64(2) {
		t.Fatalf("arguments %q: %v", a.GetArgumentsJson(), err)
	}
	if a.GetToolName() != "echo" || a.GetToolCallId() == "" || a.GetTurnId() != started.GetTurnId() || a.GetStatus() != sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING {
		t.Fatalf("pending approval %v", a)
	}
	exp := a.GetExpiresAt().AsTime()
	if exp.Before(before.Add(29*time.Second)) || exp.After(time.Now().Add(30*time.Second)) {
		t.Fatalf("expires_at %v is not 30 s after the request", exp)
	}
	view, err := h.srv.GetSessionView(context.Background(), &sessionv1.GetSessionViewRequest{Principal: operator, SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if v := view.GetView(); v.GetTurnId() != started.GetTurnId() || v.GetSession().GetState() != sessionv1.SessionState_SESSION_STATE_RUNNING || v.GetTurnStartedAt() == nil || v.GetUpdateSeq() < 2 {
		t.Fatalf("view of a running session %v", v)
	}

	ack, err := h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: operator, SessionId: id, RequestId: a.GetRequestId(),
		Decision: sessionv1.Decision_DECISION_ALLOW_ONCE, Surface: sessionv1.Surface_SURFACE_DURABLE})
	if err != nil || !ack.GetAcknowledged() {
		t.Fatalf("approve: %v %v", ack, err)
	}
	rec.until(UpdateTurnComplete)
	got := approvalOf(t, h, id, a.GetRequestId())
	if got.GetStatus() != sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED || got.GetDecision() != sessionv1.Decision_DECISION_ALLOW_ONCE ||
		got.GetSurface() != sessionv1.Surface_SURFACE_DURABLE || got.GetToolCallId() != a.GetToolCallId() || got.GetDecidedAt() == nil {
		t.Fatalf("decided approval %v", got)
	}

	// A timeout is told apart from a person's decision.
	quick := h.newSession(operator, "hasty")
	qrec := h.record(quick)
	if _, err := h.srv.StartTurn(context.Background(), &sessionv1.StartTurnRequest{Principal: operator, SessionId: quick, Prompt: `/tool echo {}`}); err != nil {
		t.Fatal(err)
	}
	var reqID string
	for _, u := range qrec.until(UpdateTurnComplete) {
		if u.Type == UpdateApprovalRequest {
			reqID = u.str("request_id")
		}
	}
	if got := approvalOf(t, h, quick, reqID); got.GetStatus() != sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT {
		t.Fatalf("timed-out approval %v", got)
	}

	// An unknown request, or one of another session, is NotFound.
	_, err = h.srv.GetApproval(context.Background(), &sessionv1.GetApprovalRequest{Principal: operator, SessionId: quick, RequestId: a.GetRequestId()})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonNotFound, a.GetRequestId())
}

// StartTurn does not wait; CancelTurn stops only the turn it names, and
// the approval the turn waited on reads cancelled.
func TestBridgeStartAndCancelTurn(t *testing.T) {
	h := newHarness(t)
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted, ApprovalRequired: []string{"echo"}, ApprovalTimeout: 30 * time.Second}})
	id := h.newSession(operator, "guarded")
	rec := h.record(id)
	ctx, cancel := context.WithCancel(context.Background())
	started, err := h.srv.StartTurn(ctx, &sessionv1.StartTurnRequest{Principal: operator, SessionId: id, Prompt: `/tool echo {"a":1}`})
	if err != nil {
		t.Fatal(err)
	}
	// The caller leaving does not end the turn.
	cancel()
	a := pendingOf(t, h, id)

	_, err = h.srv.StartTurn(context.Background(), &sessionv1.StartTurnRequest{Principal: operator, SessionId: id, Prompt: "again"})
	wantRefusal(t, err, codes.FailedPrecondition, rpcerr.ReasonSessionBusy, "running")

	other, err := h.srv.CancelTurn(context.Background(), &sessionv1.CancelTurnRequest{Principal: operator, SessionId: id, TurnId: "turn_other"})
	if err != nil || other.GetCancelled() || other.GetRunningTurnId() != started.GetTurnId() {
		t.Fatalf("cancel of another turn: %v %v", other, err)
	}
	if h.state(operator, id) != stateRunning {
		t.Fatal("a cancel naming another turn stopped the running one")
	}
	done, err := h.srv.CancelTurn(context.Background(), &sessionv1.CancelTurnRequest{Principal: operator, SessionId: id, TurnId: started.GetTurnId()})
	if err != nil || !done.GetCancelled() {
		t.Fatalf("cancel: %v %v", done, err)
	}
	ups := rec.until(UpdateTurnComplete)
	if last := ups[len(ups)-1]; last.str("outcome") != OutcomeCancelled {
		t.Fatalf("turn_complete %v", last.Params)
	}
	if got := approvalOf(t, h, id, a.GetRequestId()); got.GetStatus() != sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED {
		t.Fatalf("approval of a cancelled turn %v", got)
	}
	idle, err := h.srv.CancelTurn(context.Background(), &sessionv1.CancelTurnRequest{Principal: operator, SessionId: id, TurnId: started.GetTurnId()})
	if err != nil || idle.GetCancelled() || idle.GetRunningTurnId() != "" {
		t.Fatalf("cancel on an idle session: %v %v", idle, err)
	}
	// Another principal's session stays theirs.
	_, err = h.srv.StartTurn(context.Background(), &sessionv1.StartTurnRequest{Principal: bob, SessionId: id, Prompt: "hi"})
	wantRefusal(t, err, codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, id)
}

// Transcript reads after a cursor or the tail, with times; session views
// page most recently active first, closed ones on request.
func TestBridgeTranscriptAndPages(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(operator, "")
	for i := range 3 {
		h.prompt(operator, id, fmt.Sprintf("/say n%d", i))
	}
	tr, err := h.srv.Transcript(context.Background(), &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, AfterIndex: at64(1), Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if tr.GetTotal() != 6 || len(tr.GetMessages()) != 2 || tr.GetMessages()[0].GetIndex() != 2 || tr.GetMessages()[1].GetIndex() != 3 ||
		tr.GetMessages()[0].GetContent() != "/say n1" || tr.GetMessages()[0].GetCreatedAt() == nil {
		t.Fatalf("transcript after 1: %v", tr)
	}
	tail, err := h.srv.Transcript(context.Background(), &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, Limit: 2})
	if err != nil || len(tail.GetMessages()) != 2 || tail.GetMessages()[0].GetIndex() != 4 || tail.GetMessages()[1].GetRole() != roleAssistant {
		t.Fatalf("transcript tail: %v %v", tail, err)
	}
	from, err := h.srv.Transcript(context.Background(), &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, AfterIndex: at64(-1), Limit: 1})
	if err != nil || len(from.GetMessages()) != 1 || from.GetMessages()[0].GetIndex() != 0 {
		t.Fatalf("transcript from the start: %v %v", from, err)
	}
	_, err = h.srv.Transcript(context.Background(), &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, Limit: MaxTranscriptLimit + 1})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "limit")

	var all []string
	all = append(all, id)
	for range 4 {
		all = append(all, h.newSession(operator, ""))
	}
	if _, err := h.srv.Close(context.Background(), &sessionv1.CloseRequest{Principal: operator, SessionId: all[1]}); err != nil {
		t.Fatal(err)
	}
	page := func(closed bool) []string {
		var ids []string
		token := ""
		for {
			resp, err := h.srv.ListSessionViews(context.Background(), &sessionv1.ListSessionViewsRequest{Principal: operator, IncludeClosed: closed, PageSize: 2, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range resp.GetViews() {
				ids = append(ids, v.GetSession().GetSessionId())
			}
			if token = resp.GetNextPageToken(); token == "" {
				return ids
			}
		}
	}
	if open := page(false); len(open) != 4 || contains(open, all[1]) {
		t.Fatalf("open sessions %v (closed %s)", open, all[1])
	}
	if every := page(true); len(every) != 5 || !contains(every, all[1]) {
		t.Fatalf("every session %v", every)
	}
	_, err = h.srv.ListSessionViews(context.Background(), &sessionv1.ListSessionViewsRequest{Principal: operator, PageToken: "v2.x"})
	wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "page_token")
}

func at64(v int64) *int64 { return &v }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A session deleted and made again under its id is another session: its
// view names its own incarnation, and counts its updates from its own row
// even while the deleted session's entry is still in memory (Delete
// forgets it only after removing the rows, a holder keeps it longer, and
// its turn may outlive the rows), whose turn is not the new session's to
// show or cancel; StartTurn naming the deleted incarnation starts no turn
// in the new session.
func TestBridgeViewAndTurnOfAReplacedIncarnation(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(operator, "default")
	first, err := h.srv.GetSessionView(ctx, &sessionv1.GetSessionViewRequest{Principal: operator, SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if first.GetView().GetIncarnation() != h.incarnation(id) {
		t.Fatalf("the view names incarnation %d, the row %d", first.GetView().GetIncarnation(), h.incarnation(id))
	}
	h.prompt(operator, id, "/say one\n/say two")
	old, oldLive, release, cur := h.reuseHeld(operator, id)
	if oldLive.seq == 0 {
		t.Fatal("the turn published no update")
	}
	// The deleted session's turn outlived its rows (Delete waits for it a
	// bounded time).
	stale := &turn{id: "turn_stale", ls: oldLive, done: make(chan struct{})}
	oldLive.mu.Lock()
	oldLive.turn = stale
	oldLive.mu.Unlock()

	v, err := h.srv.GetSessionView(ctx, &sessionv1.GetSessionViewRequest{Principal: operator, SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	list, err := h.srv.ListSessionViews(ctx, &sessionv1.ListSessionViewsRequest{Principal: operator})
	if err != nil || len(list.GetViews()) != 1 {
		t.Fatalf("list %v %v", list, err)
	}
	for name, got := range map[string]*sessionv1.SessionView{"GetSessionView": v.GetView(), "ListSessionViews": list.GetViews()[0]} {
		if got.GetIncarnation() != cur.Incarnation || got.GetIncarnation() == old.Incarnation {
			t.Fatalf("%s: incarnation %d, the new row's %d, the deleted one's %d", name, got.GetIncarnation(), cur.Incarnation, old.Incarnation)
		}
		// The deleted session's sequence would have the bridge skip the
		// new session's first updates as already shown.
		if got.GetUpdateSeq() != cur.UpdateSeq {
			t.Fatalf("%s: update_seq %d, the new row's %d (the deleted session's entry is at %d)", name, got.GetUpdateSeq(), cur.UpdateSeq, oldLive.seq)
		}
		if got.GetTurnId() != "" || got.GetSession().GetState() != sessionv1.SessionState_SESSION_STATE_IDLE {
			t.Fatalf("%s: the new session shows turn %q, state %v", name, got.GetTurnId(), got.GetSession().GetState())
		}
	}
	st, err := h.srv.State(ctx, &sessionv1.StateRequest{Principal: operator, SessionId: id})
	if err != nil || st.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || st.GetTurnId() != "" {
		t.Fatalf("session/state of the new session: %v %v", st, err)
	}
	if c, err := h.srv.Cancel(ctx, &sessionv1.CancelRequest{Principal: operator, SessionId: id}); err != nil || c.GetCancelled() {
		t.Fatalf("cancel of the new session, idle: %v %v", c, err)
	}
	oldLive.mu.Lock()
	oldLive.turn = nil
	oldLive.mu.Unlock()

	rec := h.record(id)
	_, err = h.srv.StartTurn(ctx, &sessionv1.StartTurnRequest{Principal: operator, SessionId: id, Prompt: "/say lost", Incarnation: old.Incarnation})
	wantRefusal(t, err, codes.NotFound, rpcerr.ReasonSessionNotFound, id)
	release()
	started, err := h.srv.StartTurn(ctx, &sessionv1.StartTurnRequest{Principal: operator, SessionId: id, Prompt: "/say kept", Incarnation: cur.Incarnation})
	if err != nil {
		t.Fatal(err)
	}
	ups := rec.until(UpdateTurnComplete)
	for _, u := range ups {
		if s := u.str("turn_id"); s != "" && s != started.GetTurnId() {
			t.Fatalf("an update of turn %s in the new session: %v", s, u.Params)
		}
	}
	tr, err := h.srv.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, Limit: 10})
	if err != nil || tr.GetTotal() != 2 {
		t.Fatalf("transcript of the new session %v %v, want the kept turn's 2 rows", tr, err)
	}
}
