package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// crowdSession answers a prompt as the session service does (its
// turn_complete on the bus, then the answer), and, for a prompt of
// "crowd", publishes the turn_completes of crowd turns of session
// crowdOf (other connections' turns, as far as the prompting connection
// knows) between its own turn's end and its answer.
type crowdSession struct {
	sessionv1.UnimplementedSessionServiceServer
	nc      *nats.Conn
	crowdOf string
	crowd   int

	mu  sync.Mutex
	seq map[string]int64
}

func (f *crowdSession) Attach(_ context.Context, req *sessionv1.AttachRequest) (*sessionv1.AttachResponse, error) {
	subject, err := bus.SessionUpdateSubject(req.GetSessionId(), 1)
	if err != nil {
		return nil, err
	}
	return &sessionv1.AttachResponse{SessionId: req.GetSessionId(), Subject: subject}, nil
}

// complete publishes a turn_complete of turn in session id, numbered
// after the session's updates before it.
func (f *crowdSession) complete(id, turn string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq[id]++
	subject, err := bus.SessionUpdateSubject(id, 1)
	if err != nil {
		return err
	}
	js, _ := json.Marshal(map[string]any{"session_id": id, "type": "turn_complete", "turn_id": turn, "outcome": "completed"})
	data, err := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, Seq: f.seq[id], Json: string(js)})
	if err != nil {
		return err
	}
	return f.nc.Publish(subject, data)
}

func (f *crowdSession) Prompt(_ context.Context, req *sessionv1.PromptRequest) (*sessionv1.PromptResponse, error) {
	id := req.GetSessionId()
	turn := ids.New("t-")
	if err := f.complete(id, turn); err != nil {
		return nil, err
	}
	if req.GetPrompt() == "crowd" {
		for i := range f.crowd {
			if err := f.complete(f.crowdOf, fmt.Sprintf("crowd-%d", i)); err != nil {
				return nil, err
			}
		}
	}
	if err := f.nc.Flush(); err != nil {
		return nil, err
	}
	return &sessionv1.PromptResponse{SessionId: id, TurnId: turn, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED}, nil
}

// A prompt's turn_complete, written before its answer, is collected
// however many turns of other sessions the connection follows end
// between the two. The gateway remembered the last 64 turn_completes a
// connection was written, whoever's: 100 turns of a followed session
// ending meanwhile pushed the prompt's own out, and the prompt, finding
// it missing, waited the gateway's wait and closed the connection as
// one whose session updates were lost.
func TestPromptCollectsItsTurnCompleteBehindOthers(t *testing.T) {
	other, own := ids.New("s-"), ids.New("s-")
	sess := &crowdSession{crowdOf: other, crowd: 2 * maxRecentTurns, seq: map[string]int64{}}
	_, socket := runGateway(t, sess, 30*time.Second, func(g *Gateway) {
		g.turnWait = 200 * time.Millisecond
		sess.nc = g.nats
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	// The connection follows other from its prompt on.
	if _, err := c.Call("session/prompt", map[string]any{"session_id": other, "prompt": "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"session_id":%q,"prompt":"crowd"}}`, own)); err != nil {
		t.Fatal(err)
	}
	updates := 0
	for {
		f, _, err := c.Read(10 * time.Second)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("no answer after %d updates", updates)
			}
			t.Fatalf("the connection was closed after %d of %d updates: %v", updates, 1+sess.crowd, err)
		}
		if f.Method == "session/update" {
			updates++
			continue
		}
		if f.Error != nil {
			t.Fatalf("the prompt failed after %d of %d updates: %v", updates, 1+sess.crowd, f.Error)
		}
		break
	}
	if updates != 1+sess.crowd {
		t.Fatalf("the prompt was answered after %d updates, want %d", updates, 1+sess.crowd)
	}
	// The connection is still open and serves.
	if _, err := c.Call("session/prompt", map[string]any{"session_id": own, "prompt": "again"}); err != nil {
		t.Fatalf("the connection after the prompt: %v", err)
	}
}
