package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
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
	if err := turnStarted(f.nc, id, req.GetConnectionId()); err != nil {
		return nil, err
	}
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
	// The answer follows the prompt's own turn_complete; the crowd's
	// updates, published before the answer, may still be on their way
	// through the gateway when it is written: every one must come, on a
	// connection that stays open.
	updates, answered := 0, false
	for !answered || updates < 1+sess.crowd {
		f, _, err := c.Read(10 * time.Second)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("after %d of %d updates, answered %v: nothing more", updates, 1+sess.crowd, answered)
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
		answered = true
	}
	if updates != 1+sess.crowd {
		t.Fatalf("%d updates, want %d", updates, 1+sess.crowd)
	}
	// The connection is still open and serves.
	if _, err := c.Call("session/prompt", map[string]any{"session_id": own, "prompt": "again"}); err != nil {
		t.Fatalf("the connection after the prompt: %v", err)
	}
}

// turnStarted publishes the UPDATE_TYPE_TURN_STARTED of a turn of session
// id (incarnation 1) started by connection conn, as the session service
// does when it admits a prompt.
func turnStarted(nc *nats.Conn, id, conn string) error {
	subject, err := bus.SessionUpdateSubject(id, 1)
	if err != nil {
		return err
	}
	data, err := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: busv1.UpdateType_UPDATE_TYPE_TURN_STARTED, ConnectionId: conn})
	if err != nil {
		return err
	}
	return nc.Publish(subject, data)
}

// otherTurnSession runs another connection's turn on its session while
// a prompt of "lose" waits to be refused SESSION_BUSY: the turn's first
// chunk goes out while the refused prompt's connection follows the
// session for it, its turn_complete once the refusal was answered. A
// prompt of anything else is admitted: its turn_complete, then the
// answer.
type otherTurnSession struct {
	crowdSession
	// chunkOut is closed once the other turn's chunk is on the bus;
	// refuse, when closed, lets the "lose" prompt be refused.
	chunkOut, refuse chan struct{}
}

func (f *otherTurnSession) Prompt(ctx context.Context, req *sessionv1.PromptRequest) (*sessionv1.PromptResponse, error) {
	id := req.GetSessionId()
	if req.GetPrompt() != "lose" {
		return f.crowdSession.Prompt(ctx, req)
	}
	f.mu.Lock()
	f.seq[id]++
	subject, _ := bus.SessionUpdateSubject(id, 1)
	js, _ := json.Marshal(map[string]any{"session_id": id, "type": "agent_message_chunk", "turn_id": "t-other", "text": "not yours"})
	data, _ := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: f.seq[id], Json: string(js)})
	err := f.nc.Publish(subject, data)
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := f.nc.Flush(); err != nil {
		return nil, err
	}
	close(f.chunkOut)
	<-f.refuse
	return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, "Session "+id+" is running a turn")
}

// A prompt refused SESSION_BUSY shows its connection nothing of the turn
// that is running: the gateway follows the session for the prompt before
// the session service admits or refuses it, and the running turn's
// updates reached the connection meanwhile, a chunk of someone else's
// turn, out of its context, with no turn_complete ever after it.
func TestBusyPromptShowsNothingOfTheRunningTurn(t *testing.T) {
	id, elsewhere := ids.New("s-"), ids.New("s-")
	sess := &otherTurnSession{crowdSession: crowdSession{seq: map[string]int64{}}, chunkOut: make(chan struct{}), refuse: make(chan struct{})}
	_, socket := runGateway(t, sess, 30*time.Second, func(g *Gateway) { sess.nc = g.nats })
	follower := dialInitialized(t, socket)
	defer follower.Close()
	refused := dialInitialized(t, socket)
	defer refused.Close()
	// follower follows the session from its own prompt on.
	if _, err := follower.Call("session/prompt", map[string]any{"session_id": id, "prompt": "hi"}); err != nil {
		t.Fatal(err)
	}
	follower.Notifications = nil
	if err := refused.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"session_id":%q,"prompt":"lose"}}`, id)); err != nil {
		t.Fatal(err)
	}
	<-sess.chunkOut
	// Once follower has the chunk, the hub has handed it to every
	// connection following the session.
	if f, _, err := follower.Read(10 * time.Second); err != nil || f.Method != "session/update" {
		t.Fatalf("the follower got %v %v, want the other turn's chunk", f, err)
	}
	close(sess.refuse)
	var got []string
	for {
		f, line, err := refused.Read(10 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if f.Method == "session/update" {
			got = append(got, string(line))
			continue
		}
		if f.Error == nil || f.Error.Code != -32002 {
			t.Fatalf("the prompt: %s %v; want SESSION_BUSY", f.Result, f.Error)
		}
		break
	}
	// The running turn ends; refused, prompting another session, sees its
	// own turn's end alone.
	if err := sess.complete(id, "t-other"); err != nil {
		t.Fatal(err)
	}
	if f, _, err := follower.Read(10 * time.Second); err != nil || f.Method != "session/update" {
		t.Fatalf("the follower got %v %v, want the other turn's end", f, err)
	}
	refused.Notifications = nil
	if _, err := refused.Call("session/prompt", map[string]any{"session_id": elsewhere, "prompt": "hi"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range refused.Notifications {
		if !strings.Contains(string(n), elsewhere) {
			got = append(got, string(n))
		}
	}
	if len(got) > 0 {
		t.Fatalf("the connection refused SESSION_BUSY was sent the running turn's updates: %s", got)
	}
}
