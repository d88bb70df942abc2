package gateway

import (
	"bufio"
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// Each approval_request written to a connection that takes elicitations
// started an elicitation/create call that ended only on the client's
// answer, the connection's end or the approval's timeout (up to a day),
// whoever decided the approval: a client that answers none and decides
// with session/approve kept a goroutine and a pending call for every
// approval. They end with their turn now, and at most maxAsks are open.
func TestElicitationsEndWithTheirTurn(t *testing.T) {
	o := elicitingOutbox(t)
	open := func() int {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.nasks
	}
	o.mu.Lock()
	for i := range maxAsks + 36 {
		o.sent(bus.Update{Type: busv1.UpdateType_UPDATE_TYPE_APPROVAL_REQUEST, SessionID: "s-1",
			JSON: []byte(fmt.Sprintf(`{"request_id":"r-%d","tool_name":"shell","timeout_secs":3600}`, i))})
	}
	o.mu.Unlock()
	if n := open(); n != maxAsks {
		t.Fatalf("%d elicitations open, the bound is %d", n, maxAsks)
	}
	o.mu.Lock()
	o.sent(bus.Update{Type: busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, SessionID: "s-1", JSON: []byte(`{"turn_id":"turn-1"}`)})
	o.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for open() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d elicitations still open after their turn ended", open())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An approval_request the session service sends again (Resend) once it
// was decided says its decision: it is written to the client, which sees
// how it was settled, and not put to it as an elicitation. Before, a
// follower that had missed the ask and its decision (its gateway's bus
// link down) was asked for an approval already decided, or already
// denied by its timeout.
func TestASettledApprovalRequestIsNotPutToTheClient(t *testing.T) {
	o := elicitingOutbox(t)
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range []string{`"allow_once","decided_by":"rpc"`, `"timeout","decided_by":"service"`, `"cancelled","decided_by":"service"`} {
		o.sent(bus.Update{Type: busv1.UpdateType_UPDATE_TYPE_APPROVAL_REQUEST, SessionID: "s-1",
			JSON: []byte(`{"request_id":"r-1","tool_name":"shell","timeout_secs":30,"decision":` + d + `}`)})
		if o.nasks != 0 {
			t.Fatalf("an approval_request decided (%s) was put to the client: %d elicitations open", d, o.nasks)
		}
	}
	o.sent(bus.Update{Type: busv1.UpdateType_UPDATE_TYPE_APPROVAL_REQUEST, SessionID: "s-1",
		JSON: []byte(`{"request_id":"r-2","tool_name":"shell","timeout_secs":30}`)})
	if o.nasks != 1 {
		t.Fatalf("an approval_request not decided: %d elicitations open, want 1", o.nasks)
	}
}

// elicitingOutbox is the outbox of a connection that takes elicitations,
// whose client reads every call and answers none.
func elicitingOutbox(t *testing.T) *outbox {
	t.Helper()
	g := &Gateway{log: zap.NewNop()}
	ctx, cancel := context.WithCancel(context.Background())
	server, client := unixPair(t)
	conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: zap.NewNop()})
	g.spawn(func() { _ = conn.Run(ctx) })
	cs := &connState{id: "conn-1", conn: conn}
	cs.bind(&commonv1.Principal{PrincipalId: "shared-operator", Operator: true}, true, "")
	o := newOutbox(ctx, g, cs)
	t.Cleanup(func() { cancel(); conn.Close(); client.Close(); g.wg.Wait() })
	go func() { // a client that reads every call and answers none
		r := bufio.NewReader(client)
		for {
			if _, err := r.ReadBytes('\n'); err != nil {
				return
			}
		}
	}()
	return o
}
