package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// decidedSession answers Approve by the request's id: "ap_slow" waits
// past its caller's deadline; any other is already decided, with the
// standing decision of outcomes[id].
type decidedSession struct {
	sessionv1.UnimplementedSessionServiceServer
	outcomes map[string]*sessionv1.ApproveResponse
}

func (f *decidedSession) Approve(ctx context.Context, req *sessionv1.ApproveRequest) (*sessionv1.ApproveResponse, error) {
	if req.GetRequestId() == "ap_slow" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	o := f.outcomes[req.GetRequestId()]
	return &sessionv1.ApproveResponse{SessionId: req.GetSessionId(), RequestId: req.GetRequestId(), AlreadyDecided: true,
		Status: o.GetStatus(), Decision: o.GetDecision(), Surface: o.GetSurface()}, nil
}

// session/approve's already_decided answer says which decision stands
// (decision, decided_by: the words of an approval_request sent again),
// and one whose session service call timed out says that the decision
// may still be recorded and to send it again. Before, already_decided
// came alone, and the timeout said "session timed out".
func TestSessionApproveSaysWhichDecisionStands(t *testing.T) {
	sess := &decidedSession{outcomes: map[string]*sessionv1.ApproveResponse{
		"ap_phone":   {Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED, Decision: sessionv1.Decision_DECISION_REJECT, Surface: sessionv1.Surface_SURFACE_DURABLE},
		"ap_timeout": {Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT},
		"ap_ended":   {Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED},
		"ap_pending": {Status: sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING},
	}}
	_, socket := runGateway(t, sess, 2*time.Second)
	c := dialInitialized(t, socket)
	defer c.Close()
	id := ids.New("s-")
	approve := func(reqID string) (json.RawMessage, error) {
		return c.Call("session/approve", map[string]any{"session_id": id, "request_id": reqID, "decision": "allow_once"})
	}
	for reqID, want := range map[string]string{
		"ap_phone":   `"already_decided":true,"decided_by":"durable","decision":"reject"`,
		"ap_timeout": `"already_decided":true,"decided_by":"service","decision":"timeout"`,
		"ap_ended":   `"already_decided":true,"decided_by":"service","decision":"cancelled"`,
		"ap_pending": `"already_decided":true,"request_id"`,
	} {
		res, err := approve(reqID)
		if err != nil || !strings.Contains(string(res), want) {
			t.Errorf("%s: answered %s %v, want %s", reqID, res, err, want)
		}
	}
	_, err := approve("ap_slow")
	var rpcErr *rpcclient.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != -32603 ||
		rpcErr.Message != "session timed out on approval request `ap_slow`: its decision may still be recorded; send it again to learn which decision stands" {
		t.Fatalf("a call past its deadline answered %v", err)
	}
}
