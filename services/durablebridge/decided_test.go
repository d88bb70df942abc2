package durablebridge

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// decidedSessions answers every Approve already_decided, with the
// decision that stands (stands) when withStanding is set, as a session
// service of this round does, or without it, as one before it did; its
// GetApproval reports the same decision. It counts both calls.
type decidedSessions struct {
	sessionv1.SessionServiceClient
	stands                *sessionv1.ApprovalView
	withStanding          bool
	approves, getApproval atomic.Int32
}

func (s *decidedSessions) Approve(_ context.Context, in *sessionv1.ApproveRequest, _ ...grpc.CallOption) (*sessionv1.ApproveResponse, error) {
	s.approves.Add(1)
	resp := &sessionv1.ApproveResponse{SessionId: in.GetSessionId(), RequestId: in.GetRequestId(), AlreadyDecided: true}
	if s.withStanding {
		resp.Status, resp.Decision, resp.Surface = s.stands.GetStatus(), s.stands.GetDecision(), s.stands.GetSurface()
	}
	return resp, nil
}

func (s *decidedSessions) GetApproval(_ context.Context, in *sessionv1.GetApprovalRequest, _ ...grpc.CallOption) (*sessionv1.GetApprovalResponse, error) {
	s.getApproval.Add(1)
	v := proto.CloneOf(s.stands)
	v.SessionId, v.RequestId = in.GetSessionId(), in.GetRequestId()
	return &sessionv1.GetApprovalResponse{Approval: v}, nil
}

// An answer from the phone that comes second is told which decision
// stands from Approve's own answer, which carries it: one session call,
// where the bridge made a second (GetApproval) to learn it. Collie is
// told the same as before (WIRE: 409 decided, by, outcome), and as an
// older session service's answer, without the decision, still gets
// through its GetApproval; a pending one is too-late either way.
func TestAnswerDecidedFirstIsToldFromApprovesAnswer(t *testing.T) {
	w := newWireBridge(t, true)
	stand := &decidedSessions{}
	w.b.sessions = stand
	w.b.layout.SetReady()
	c := w.collie(t)

	for i, tc := range []struct {
		name   string
		stands *sessionv1.ApprovalView
		status int
		body   string
	}{
		{"rejected by a program", &sessionv1.ApprovalView{Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED,
			Decision: sessionv1.Decision_DECISION_REJECT, Surface: sessionv1.Surface_SURFACE_RPC},
			http.StatusConflict, `{"code":"decided","by":"program","outcome":{"option":"reject"}}`},
		{"allowed always by an elicitation", &sessionv1.ApprovalView{Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED,
			Decision: sessionv1.Decision_DECISION_ALLOW_ALWAYS, Surface: sessionv1.Surface_SURFACE_ELICITATION},
			http.StatusConflict, `{"code":"decided","by":"program","outcome":{"option":"allow_always"}}`},
		{"allowed once by another phone", &sessionv1.ApprovalView{Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED,
			Decision: sessionv1.Decision_DECISION_ALLOW_ONCE, Surface: sessionv1.Surface_SURFACE_DURABLE},
			http.StatusConflict, `{"code":"decided","by":"phone","outcome":{"option":"allow_once"}}`},
		{"timed out", &sessionv1.ApprovalView{Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT},
			http.StatusConflict, `{"code":"decided","by":"timeout","outcome":{"option":"reject"}}`},
		{"cancelled", &sessionv1.ApprovalView{Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED},
			http.StatusConflict, `{"code":"decided","by":"program","outcome":{"option":"reject"}}`},
		{"pending", &sessionv1.ApprovalView{Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING},
			http.StatusOK, `{"ok":false,"code":"too-late"}`},
	} {
		for _, withStanding := range []bool{true, false} {
			name := fmt.Sprintf("%s, standing decision in the answer %v", tc.name, withStanding)
			// A pane and ask of its own: a decided ask is closed.
			paneID, toolCallID := fmt.Sprintf("s-%d-%v", i, withStanding), fmt.Sprintf("tc-%d", i)
			w.addPane(paneID, "main", 1, testAsk(paneID, toolCallID))
			stand.stands, stand.withStanding = tc.stands, withStanding
			stand.approves.Store(0)
			stand.getApproval.Store(0)

			body := fmt.Sprintf(`{"requestId":"r-%s","askId":%q,"revision":1,"answer":{"option":"allow_once"}}`, paneID, askID(paneID, toolCallID))
			r := raw(t, c, http.MethodPost, "/pane/"+paneID+"/answer", v1(), []byte(body))
			if r.Status != tc.status || string(r.Body) != tc.body {
				t.Fatalf("%s: Collie is told %d %s; want %d %s", name, r.Status, r.Body, tc.status, tc.body)
			}
			wantCalls := int32(1) // Approve alone
			if !withStanding {
				wantCalls = 2 // and GetApproval, to learn what the answer did not say
			}
			if n := stand.approves.Load() + stand.getApproval.Load(); n != wantCalls {
				t.Fatalf("%s: %d session calls (Approve %d, GetApproval %d); want %d", name, n, stand.approves.Load(), stand.getApproval.Load(), wantCalls)
			}
			if tc.status != http.StatusConflict {
				continue
			}
			// The ask is closed as decided: the same answer sent again
			// under a new request id is told so without asking.
			again := fmt.Sprintf(`{"requestId":"r2-%s","askId":%q,"revision":1,"answer":{"option":"allow_once"}}`, paneID, askID(paneID, toolCallID))
			r = raw(t, c, http.MethodPost, "/pane/"+paneID+"/answer", v1(), []byte(again))
			if r.Status != tc.status || string(r.Body) != tc.body {
				t.Fatalf("%s: sent again, Collie is told %d %s; want %d %s", name, r.Status, r.Body, tc.status, tc.body)
			}
			if n := stand.approves.Load() + stand.getApproval.Load(); n != wantCalls {
				t.Fatalf("%s: sent again to a closed ask, the session service was called", name)
			}
		}
	}
}
