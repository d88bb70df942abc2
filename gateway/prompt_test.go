package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// streamingSession answers a prompt as the session service does: it
// publishes the turn's updates on the session's subject, its
// turn_complete last, and answers once they are all on the bus.
type streamingSession struct {
	sessionv1.UnimplementedSessionServiceServer
	nc     *nats.Conn
	chunks int
	text   string
	// lost leaves the turn_complete out, as if the bus had lost it.
	lost bool
	// incarnation is the session's (1 when unset); prompts to another are
	// refused as the session service refuses them, and counted.
	incarnation, refused atomic.Int64
}

func (f *streamingSession) current() int64 {
	if n := f.incarnation.Load(); n != 0 {
		return n
	}
	return 1
}

func (f *streamingSession) Attach(_ context.Context, req *sessionv1.AttachRequest) (*sessionv1.AttachResponse, error) {
	subject, err := bus.SessionUpdateSubject(req.GetSessionId(), f.current())
	if err != nil {
		return nil, err
	}
	return &sessionv1.AttachResponse{SessionId: req.GetSessionId(), Subject: subject}, nil
}

func (f *streamingSession) Prompt(_ context.Context, req *sessionv1.PromptRequest) (*sessionv1.PromptResponse, error) {
	id := req.GetSessionId()
	if n := req.GetIncarnation(); n != 0 && n != f.current() {
		f.refused.Add(1)
		return nil, status.Errorf(codes.NotFound, "Session %s not found", id)
	}
	subject, err := bus.SessionUpdateSubject(id, f.current())
	if err != nil {
		return nil, err
	}
	started, err := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: busv1.UpdateType_UPDATE_TYPE_TURN_STARTED, ConnectionId: req.GetConnectionId()})
	if err != nil {
		return nil, err
	}
	if err := f.nc.Publish(subject, started); err != nil {
		return nil, err
	}
	publish := func(seq int, typ busv1.UpdateType, body map[string]any) error {
		body["session_id"] = id
		js, err := json.Marshal(body)
		if err != nil {
			return err
		}
		data, err := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: typ, Seq: int64(seq), Json: string(js)})
		if err != nil {
			return err
		}
		return f.nc.Publish(subject, data)
	}
	const turn = "t-1"
	for i := range f.chunks {
		if err := publish(i+1, busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK,
			map[string]any{"type": "agent_message_chunk", "text": f.text, "n": i}); err != nil {
			return nil, err
		}
	}
	if !f.lost {
		if err := publish(f.chunks+1, busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE,
			map[string]any{"type": "turn_complete", "turn_id": turn, "outcome": "completed"}); err != nil {
			return nil, err
		}
	}
	if err := f.nc.Flush(); err != nil {
		return nil, err
	}
	return &sessionv1.PromptResponse{SessionId: id, TurnId: turn, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED}, nil
}

// A prompt's response comes after its turn_complete was written, however
// long the stream ahead of it takes to write while it moves. The client
// reads nothing for the first half second of a 20 MB turn, so the
// connection's output queue fills to its bound (16 MiB) and the rest of
// the stream, its turn_complete last, waits in the connection's outbox
// for five times the gateway's wait for a connection where nothing moves
// (100 ms here). With a bound on the whole wait, the response was queued
// behind the first 16 MiB and ahead of the rest: it overtook the end of
// its stream.
func TestPromptResponseWaitsForAStreamStillBeingWritten(t *testing.T) {
	const chunks = 5000
	sess := &streamingSession{chunks: chunks, text: strings.Repeat("x", 4000)}
	_, socket := runGateway(t, sess, 30*time.Second, func(g *Gateway) {
		g.turnWait = 100 * time.Millisecond
		sess.nc = g.nats // the gateway's bus, as the session service's would be
	})
	c := dialInitialized(t, socket)
	defer c.Close()

	start := time.Now()
	updates, resp := promptAndRead(t, c, 500*time.Millisecond)
	if resp.Error != nil {
		t.Fatalf("prompt failed: %v", resp.Error)
	}
	if updates != chunks+1 {
		t.Fatalf("the prompt's response came after %d of the turn's %d updates (%v into the stream)",
			updates, chunks+1, time.Since(start).Round(time.Millisecond))
	}
}

// A turn_complete that never comes (lost on the bus) does not hold the
// response for ever, nor is the turn answered as ended over a stream that
// lacks its end: once the turn's other updates are written and nothing
// moves for the gateway's wait, the connection is closed, after them, as
// for a gap in seq; a response written before the close is an error.
func TestPromptResponseWithoutItsTurnComplete(t *testing.T) {
	const chunks = 20
	sess := &streamingSession{chunks: chunks, text: "hello", lost: true}
	_, socket := runGateway(t, sess, 30*time.Second, func(g *Gateway) {
		g.turnWait = 200 * time.Millisecond
		sess.nc = g.nats
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"session_id":%q,"prompt":"go"}}`, ids.New("s-"))); err != nil {
		t.Fatal(err)
	}
	updates := 0
	for {
		f, _, err := c.Read(10 * time.Second)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the connection is still open %d updates into a turn whose turn_complete never came", updates)
			}
			break
		}
		switch {
		case f.Method == "session/update":
			updates++
		case f.Error == nil:
			t.Fatalf("the turn was answered %s after %d of its %d updates, its turn_complete lost", f.Result, updates, chunks)
		default:
			t.Logf("the prompt failed: %v", f.Error)
		}
	}
	if updates != chunks {
		t.Fatalf("the connection was closed after %d of the turn's %d updates", updates, chunks)
	}
}

// A connection that follows a session may still follow it after it was
// deleted, its id naming a new session made where this gateway did not
// see it, until the deletion's update reaches the hub. A prompt in that
// instant goes to the new session, whose updates come on the new
// incarnation's subject: the session service refuses a prompt whose
// incarnation is not the session's, and the gateway attaches again and
// retries, so the turn's updates reach the connection. (The deletion's
// update never comes here: the hub holds the old topic throughout.)
func TestPromptToASessionReplacedWhileFollowed(t *testing.T) {
	const chunks = 3
	sess := &streamingSession{chunks: chunks, text: "hello"}
	_, socket := runGateway(t, sess, 30*time.Second, func(g *Gateway) { sess.nc = g.nats })
	c := dialInitialized(t, socket)
	defer c.Close()
	id := ids.New("s-")
	for turn, incarnation := range []int64{1, 2, 2} {
		sess.incarnation.Store(incarnation)
		updates, resp := promptAndReadSession(t, c, id, 0)
		if resp.Error != nil || updates != chunks+1 {
			t.Fatalf("prompt %d (incarnation %d): %d of %d updates, %s %v", turn, incarnation, updates, chunks+1, resp.Result, resp.Error)
		}
	}
	if n := sess.refused.Load(); n != 1 {
		t.Fatalf("%d prompts refused, want the one to the deleted incarnation", n)
	}
}

// promptAndRead prompts a new session on c, leaves the connection unread
// for pause, then reads until the prompt's response: it returns the
// updates read before it, whose chunks must come in their order.
func promptAndRead(t *testing.T, c *rpcclient.Client, pause time.Duration) (int, *rpcclient.Frame) {
	t.Helper()
	return promptAndReadSession(t, c, ids.New("s-"), pause)
}

// promptAndReadSession is promptAndRead of session id.
func promptAndReadSession(t *testing.T, c *rpcclient.Client, id string, pause time.Duration) (int, *rpcclient.Frame) {
	t.Helper()
	if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"session_id":%q,"prompt":"go"}}`, id)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(pause)
	updates := 0
	for {
		f, _, err := c.Read(10 * time.Second)
		if err != nil {
			t.Fatalf("no response after %d updates: %v", updates, err)
		}
		if f.Method != "session/update" {
			return updates, f
		}
		var u struct {
			Type string `json:"type"`
			N    int    `json:"n"`
		}
		if err := json.Unmarshal(f.Params, &u); err != nil {
			t.Fatal(err)
		}
		if u.Type == "agent_message_chunk" && u.N != updates {
			t.Fatalf("update %d arrived as number %d", u.N, updates)
		}
		updates++
	}
}

// busySession admits the prompt "win" and refuses "lose" as busy, once
// "win" was admitted; "win"'s updates go out after "lose" was answered.
type busySession struct {
	sessionv1.UnimplementedSessionServiceServer
	nc                           *nats.Conn
	loseIn, winStarted, loseDone chan struct{}
}

func (f *busySession) Attach(_ context.Context, req *sessionv1.AttachRequest) (*sessionv1.AttachResponse, error) {
	subject, err := bus.SessionUpdateSubject(req.GetSessionId(), 1)
	if err != nil {
		return nil, err
	}
	return &sessionv1.AttachResponse{SessionId: req.GetSessionId(), Subject: subject}, nil
}

func (f *busySession) Prompt(_ context.Context, req *sessionv1.PromptRequest) (*sessionv1.PromptResponse, error) {
	id := req.GetSessionId()
	if req.GetPrompt() == "lose" {
		close(f.loseIn)
		<-f.winStarted
		defer close(f.loseDone)
		return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, "Session "+id+" is running a turn")
	}
	if err := turnStarted(f.nc, id, req.GetConnectionId()); err != nil {
		return nil, err
	}
	close(f.winStarted)
	<-f.loseDone
	time.Sleep(200 * time.Millisecond) // the gateway has the refusal by then
	subject, _ := bus.SessionUpdateSubject(id, 1)
	for i, typ := range []busv1.UpdateType{busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE} {
		body := map[string]any{"session_id": id, "turn_id": "t-1", "type": "agent_message_chunk", "text": "hello"}
		if i == 1 {
			body = map[string]any{"session_id": id, "turn_id": "t-1", "type": "turn_complete", "outcome": "completed"}
		}
		js, _ := json.Marshal(body)
		data, _ := proto.Marshal(&busv1.SessionUpdate{SessionId: id, Type: typ, Seq: int64(i + 1), Json: string(js)})
		if err := f.nc.Publish(subject, data); err != nil {
			return nil, err
		}
	}
	_ = f.nc.Flush()
	return &sessionv1.PromptResponse{SessionId: id, TurnId: "t-1", Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED, Content: "hello"}, nil
}

// Two prompts to one session on one connection: the first follows the
// session, the second finds it followed and is admitted, the first is
// refused SESSION_BUSY. Undoing the first's follow cut the admitted
// turn's updates, turn_complete included, from its connection: a follow
// another prompt relies on is kept.
func TestRefusedPromptKeepsTheFollowAnAdmittedOneReliesOn(t *testing.T) {
	sess := &busySession{loseIn: make(chan struct{}), winStarted: make(chan struct{}), loseDone: make(chan struct{})}
	_, socket := runGateway(t, sess, 30*time.Second, func(g *Gateway) {
		g.turnWait = 500 * time.Millisecond
		sess.nc = g.nats
	})
	c := dialInitialized(t, socket)
	defer c.Close()
	id := ids.New("s-")
	if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"session_id":%q,"prompt":"lose"}}`, id)); err != nil {
		t.Fatal(err)
	}
	<-sess.loseIn // "lose" follows the session and waits in Prompt for "win"
	if err := c.Send(fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"session_id":%q,"prompt":"win"}}`, id)); err != nil {
		t.Fatal(err)
	}
	var updates []string
	for {
		f, _, err := c.Read(10 * time.Second)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if f.Method == "session/update" {
			var p struct{ Type string }
			_ = json.Unmarshal(f.Params, &p)
			updates = append(updates, p.Type)
			continue
		}
		if string(f.ID) == "1" && (f.Error == nil || f.Error.Code != -32002) {
			t.Fatalf("the first prompt: %s %v; want SESSION_BUSY", f.Result, f.Error)
		}
		if string(f.ID) == "2" {
			break
		}
	}
	if strings.Join(updates, " ") != "agent_message_chunk turn_complete" {
		t.Fatalf("the admitted turn's connection got updates %v", updates)
	}
}
