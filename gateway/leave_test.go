package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// endingSession runs each prompt until the test releases it, then
// publishes the turn's turn_complete (outcome cancelled, as a close or
// kill leaves it) and answers; session/close and session/kill answer at
// once, so the turn's end reaches the gateway after their answers, as it
// may from the real session service on a loaded machine.
type endingSession struct {
	openClose
	nc               *nats.Conn
	started, release chan struct{}
}

func (f *endingSession) Attach(_ context.Context, req *sessionv1.AttachRequest) (*sessionv1.AttachResponse, error) {
	subject, err := bus.SessionUpdateSubject(req.GetSessionId(), 1)
	if err != nil {
		return nil, err
	}
	return &sessionv1.AttachResponse{SessionId: req.GetSessionId(), Subject: subject}, nil
}

func (f *endingSession) Prompt(ctx context.Context, req *sessionv1.PromptRequest) (*sessionv1.PromptResponse, error) {
	id := req.GetSessionId()
	if err := turnStarted(f.nc, id, req.GetConnectionId()); err != nil {
		return nil, err
	}
	f.started <- struct{}{}
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	subject, err := bus.SessionUpdateSubject(id, 1)
	if err != nil {
		return nil, err
	}
	js, _ := json.Marshal(map[string]any{"session_id": id, "type": "turn_complete", "turn_id": "t-" + id, "outcome": "cancelled"})
	data, err := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, Seq: 1, Json: string(js)})
	if err != nil {
		return nil, err
	}
	if err := f.nc.Publish(subject, data); err != nil {
		return nil, err
	}
	if err := f.nc.Flush(); err != nil {
		return nil, err
	}
	return &sessionv1.PromptResponse{SessionId: id, TurnId: "t-" + id, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_CANCELLED}, nil
}

// A connection that closes or kills the session its own prompt runs on
// still gets that turn's turn_complete, before the prompt's answer: the
// close detaches it once the prompt has ended. Detached at the close's
// answer, the turn's end, which may reach the gateway later, went to
// nobody: the prompt answered without it, a turn wait later.
func TestCloseDuringOwnPromptKeepsItsTurnComplete(t *testing.T) {
	sess := &endingSession{started: make(chan struct{}, 1)}
	g, socket := runGateway(t, sess, 10*time.Second, func(g *Gateway) {
		g.turnWait = 100 * time.Millisecond
		sess.nc = g.nats
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	for _, end := range []string{"session/close", "session/kill"} {
		raw, err := c.Call("session/new", map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			SessionID string `json:"session_id"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		sess.release = make(chan struct{})
		if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":"p","method":"session/prompt","params":{"session_id":%q,"prompt":"go"}}`, s.SessionID)); err != nil {
			t.Fatal(err)
		}
		<-sess.started
		if _, err := c.Call(end, map[string]any{"session_id": s.SessionID}); err != nil {
			t.Fatal(err)
		}
		close(sess.release)
		completes := 0
		for {
			f, _, err := c.Read(10 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if f.Method == "session/update" {
				completes++
				continue
			}
			if string(f.ID) != `"p"` || f.Error != nil {
				t.Fatalf("%s: prompt answered %s %v", end, f.ID, f.Error)
			}
			break
		}
		if completes != 1 {
			t.Fatalf("%s during the connection's own prompt: %d turn_complete before the prompt's answer, want 1", end, completes)
		}
		// Once the prompt has ended, the session is not followed.
		g.hub.mu.Lock()
		_, followed := g.hub.topics[s.SessionID]
		g.hub.mu.Unlock()
		if followed {
			t.Fatalf("%s: the session's topic is kept after the prompt ended", end)
		}
	}
}
