package gateway

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/testenv"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// resendRig answers the hub's Resend: with lost set, a loss; else the
// rig's updates numbered after the request's after_seq up to its
// upto_seq, built as the rig publishes them.
type resendRig struct {
	r     *lossRig
	lost  string
	asked chan *sessionv1.ResendRequest
}

func (s *resendRig) Resend(_ context.Context, req *sessionv1.ResendRequest, _ ...grpc.CallOption) (*sessionv1.ResendResponse, error) {
	s.asked <- req
	if s.lost != "" {
		return &sessionv1.ResendResponse{Lost: s.lost}, nil
	}
	resp := &sessionv1.ResendResponse{UptoSeq: req.GetUptoSeq()}
	for seq := req.GetAfterSeq() + 1; seq <= req.GetUptoSeq(); seq++ {
		body := fmt.Sprintf(`{"session_id":%q,"seq":%d,"type":"agent_message_chunk","turn_id":%q}`, s.r.sessionID, seq, s.r.turnID)
		resp.Updates = append(resp.Updates, bus.EncodeSessionUpdate(s.r.sessionID, busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, seq, []byte(body), ""))
	}
	return resp, nil
}

// readSeqs reads n updates from the follower's client end.
func (r *lossRig) readSeqs(n int) []int64 {
	r.t.Helper()
	_ = r.followerClient.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []int64
	for len(got) < n {
		seq, err := r.nextSeq()
		if err != nil {
			r.t.Fatalf("the following connection, after seqs %v: %v", got, err)
		}
		got = append(got, seq)
	}
	return got
}

// A gap in a session's seq (updates 2 and 3 lost between the session
// service and the gateway) that the session service can fill: the
// gateway asks it for them, holds the updates that come meanwhile, and
// sends the follower 1 to 5 in order; it stays open. Before, the gap
// closed it.
func TestSeqGapFilledFromTheSessionServiceKeepsTheFollower(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRig(t, srv.URL())
	rs := &resendRig{r: r, asked: make(chan *sessionv1.ResendRequest, 4)}
	r.h.resend = rs.Resend
	r.publish(1, false)
	if got := r.readSeqs(1); got[0] != 1 {
		t.Fatalf("first update %v", got)
	}
	r.publish(4, false)
	r.publish(5, true)
	got := r.readSeqs(4)
	for i, seq := range got {
		if seq != int64(i+2) {
			t.Fatalf("the follower got %v after 1, not 2 to 5", got)
		}
	}
	req := rs.wasAsked(t)
	if req.GetAfterSeq() != 1 || req.GetUptoSeq() != 3 || req.GetSessionId() != r.sessionID || req.GetIncarnation() != 1 {
		t.Fatalf("the gateway asked %v", req)
	}
	select {
	case <-r.follower.conn.Done():
		t.Fatal("the follower of a gap filled again was closed")
	default:
	}
}

// The same gap the session service cannot fill (it says why): the
// follower is closed, fed nothing past 1.
func TestSeqGapNotFilledClosesTheFollower(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRig(t, srv.URL())
	rs := &resendRig{r: r, lost: "updates of turn t after 1 were missed mid-turn", asked: make(chan *sessionv1.ResendRequest, 4)}
	r.h.resend = rs.Resend
	r.publish(1, false)
	r.publish(4, false)
	if got := r.followerStream(); len(got) != 1 {
		t.Fatalf("the follower got %v", got)
	}
	rs.wasAsked(t)
}

// wasAsked returns the Resend call the hub made.
func (s *resendRig) wasAsked(t *testing.T) *sessionv1.ResendRequest {
	t.Helper()
	select {
	case req := <-s.asked:
		return req
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not ask the session service to send the missed updates again")
	}
	return nil
}
