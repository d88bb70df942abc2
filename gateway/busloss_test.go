package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/testenv"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// lossRig is a hub on a gateway's bus connection (the production options,
// natsutil's), a session's publisher on a connection of its own, and two
// client connections: follower follows the session, idle follows nothing.
type lossRig struct {
	t                 *testing.T
	gwnc, pubnc       *nats.Conn
	follower, idle    *connState
	followerClient    net.Conn
	followerLines     *bufio.Reader // followerClient's, one for the test (nextSeq)
	idleClient        net.Conn
	pub               *bus.SessionUpdatePublisher
	sessionID, turnID string

	h *hub
	// seqs answers the hub's UpdateSeqs from what the rig published; nil,
	// the hub has no session service to ask.
	seqs *fakeSeqs
	// checks has a value each time a reconnect's check is done.
	checks chan struct{}
	open   func(name string) (*connState, net.Conn)
}

func newLossRig(t *testing.T, url string) *lossRig {
	t.Helper()
	return newLossRigOn(t, url, nil)
}

// newLossRigOn is newLossRig whose hub asks seqs, when not nil, after a
// reconnect.
func newLossRigOn(t *testing.T, url string, seqs *fakeSeqs) *lossRig {
	t.Helper()
	log := testenv.Logger(t)
	// The bus connections log through a logger of their own: nats.go
	// calls their handlers after the test, when they are closed.
	gwnc, err := natsutil.Connect(natsutil.Options{URL: url, Name: "gateway", Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gwnc.Close)
	pubnc, err := natsutil.Connect(natsutil.Options{URL: url, Name: "session", Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pubnc.Close)

	g := &Gateway{log: log}
	var ask updateSeqsFunc
	if seqs != nil {
		ask = seqs.UpdateSeqs
	}
	h := newHub(gwnc, log, ask)
	ctx, cancel := context.WithCancel(context.Background())
	r := &lossRig{t: t, gwnc: gwnc, pubnc: pubnc, sessionID: ids.New("s-"), turnID: ids.New("t-"),
		h: h, seqs: seqs, checks: make(chan struct{}, 16)}
	h.checked = func() {
		select {
		case r.checks <- struct{}{}:
		default:
		}
	}
	open := func(name string) (*connState, net.Conn) {
		server, client := unixPair(t)
		conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: log})
		g.spawn(func() { _ = conn.Run(ctx) })
		cs := &connState{id: name, conn: conn}
		cs.outbox = newOutbox(ctx, g, cs)
		g.spawn(cs.outbox.run)
		return cs, client
	}
	r.open = open
	r.follower, r.followerClient = open("follower")
	r.idle, r.idleClient = open("idle")
	t.Cleanup(func() {
		h.close()
		cancel()
		for _, cs := range []*connState{r.follower, r.idle} {
			h.detach(cs, "")
			cs.outbox.close()
			cs.conn.Close()
		}
		r.followerClient.Close()
		r.idleClient.Close()
		g.wg.Wait()
	})
	subject, err := bus.SessionUpdateSubject(r.sessionID, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.attach(r.follower, r.sessionID, subject, -1, true, false); err != nil {
		t.Fatal(err)
	}
	if r.pub, err = bus.NewSessionUpdatePublisher(pubnc, r.sessionID, 1); err != nil {
		t.Fatal(err)
	}
	return r
}

// publish publishes the session's update seq; turn_complete when last.
// A publish may fail while the bus is down: the update is lost.
func (r *lossRig) publish(seq int64, last bool) {
	r.publishOn(r.pub, r.sessionID, seq, last)
}

// publishOn publishes update seq of the session sessionID with pub, and
// tells r.seqs its number.
func (r *lossRig) publishOn(pub *bus.SessionUpdatePublisher, sessionID string, seq int64, last bool) {
	typ, wire := busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, "agent_message_chunk"
	if last {
		typ, wire = busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, "turn_complete"
	}
	body := fmt.Sprintf(`{"session_id":%q,"seq":%d,"type":%q,"turn_id":%q}`, sessionID, seq, wire, r.turnID)
	if r.seqs != nil {
		r.seqs.published(sessionID, seq)
	}
	if err := pub.Publish(typ, seq, []byte(body)); err != nil {
		r.t.Logf("publish %d: %v", seq, err)
	}
}

// waitConnected waits until both bus connections are up again and the
// gateway's subscriptions are back at the server.
func (r *lossRig) waitConnected() {
	r.t.Helper()
	testenv.Eventually(r.t, 20*time.Second, 5*time.Millisecond, func() error {
		if !r.gwnc.IsConnected() || !r.pubnc.IsConnected() {
			return fmt.Errorf("bus connections not back (gateway %v, session %v)", r.gwnc.Status(), r.pubnc.Status())
		}
		return nil
	})
	if err := r.gwnc.Flush(); err != nil {
		r.t.Fatal(err)
	}
}

// followerStream reads the follower's client end until the connection
// ends, and fails the test unless it ends (within a liveness bound) and
// what came before is the stream's beginning with no hole: 1, 2, ...
func (r *lossRig) followerStream() []int64 {
	r.t.Helper()
	_ = r.followerClient.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []int64
	for {
		seq, err := r.nextSeq()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				r.t.Fatalf("the following connection is still open after updates were lost; it got seqs %v", got)
			}
			break
		}
		got = append(got, seq)
	}
	for i, seq := range got {
		if seq != int64(i+1) {
			r.t.Fatalf("the following connection was fed a stream with a hole: seqs %v", got)
		}
	}
	return got
}

// nextSeq reads the follower's next update and returns its seq. One
// reader serves the whole test: a reader made a call would drop what it
// had buffered past its line.
func (r *lossRig) nextSeq() (int64, error) {
	r.t.Helper()
	if r.followerLines == nil {
		r.followerLines = bufio.NewReader(r.followerClient)
	}
	line, err := r.followerLines.ReadBytes('\n')
	if err != nil {
		return 0, err
	}
	var f struct {
		Params struct {
			Seq int64 `json:"seq"`
		} `json:"params"`
	}
	if err := json.Unmarshal(line, &f); err != nil {
		r.t.Fatalf("frame %q: %v", line, err)
	}
	return f.Params.Seq, nil
}

// idleStaysOpen fails the test if the connection that follows nothing
// was closed.
func (r *lossRig) idleStaysOpen() {
	r.t.Helper()
	select {
	case <-r.idle.conn.Done():
		r.t.Fatal("a connection that follows no session was closed")
	default:
	}
	_ = r.idleClient.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	if _, err := r.idleClient.Read(b[:]); err == nil {
		r.t.Fatal("the connection that follows nothing was sent something")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		r.t.Fatalf("the connection that follows nothing ended: %v", err)
	}
}

// The bus server drops the gateway's connection (as it does a slow
// consumer, or on a network blip) while a turn's updates, its
// turn_complete among them, are published: they are lost, and no update
// follows that would show a gap. The connection following the session is
// closed, not left open with a hole in its stream and no turn_complete;
// a connection following nothing stays open.
func TestBusDropClosesConnectionsFollowingSessions(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRig(t, srv.URL())
	for seq := int64(1); seq <= 3; seq++ {
		r.publish(seq, false)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}

	cid, err := r.gwnc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Server().DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
		if r.gwnc.IsConnected() {
			return fmt.Errorf("the gateway's bus connection was not seen dropped")
		}
		return nil
	})
	// The turn goes on meanwhile, and ends: nobody hears it.
	r.publish(4, false)
	r.publish(5, false)
	r.publish(6, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Nothing follows: no later update shows a gap in seq, and without
	// the reconnect the client would wait for its turn_complete for ever.
	r.waitConnected()

	got := r.followerStream()
	t.Logf("the following connection got seqs %v, then was closed", got)
	r.idleStaysOpen()
}

// The bus server restarts mid-turn, on the same address: what the
// session service published while it was down may reach the gateway or
// not (which of the two reconnects first decides), and a lost
// turn_complete shows no gap. The connection following the session is
// closed whichever it was; a connection following nothing stays open.
func TestBusRestartClosesConnectionsFollowingSessions(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRig(t, srv.URL())
	r.publish(1, false)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
		if r.gwnc.IsConnected() || r.pubnc.IsConnected() {
			return fmt.Errorf("the bus connections were not seen dropped")
		}
		return nil
	})
	// Mid-turn, the bus is down: the session's publishes are buffered by
	// its connection, to go out when it reconnects.
	r.publish(2, false)
	r.publish(3, true)
	srv.Start()
	r.waitConnected()
	r.publish(4, false)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}

	got := r.followerStream()
	t.Logf("the following connection got seqs %v, then was closed", got)
	r.idleStaysOpen()
}

// A gap in a session's seq (updates lost between the session service and
// the gateway with no reconnect seen here) closes the connections that
// follow the session after the updates before the gap; a connection
// following nothing stays open.
func TestSeqGapClosesConnectionsFollowingTheSession(t *testing.T) {
	r := newLossRig(t, testenv.NATS(t))
	r.publish(1, false)
	r.publish(2, false)
	r.publish(5, false)
	r.publish(6, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := r.followerStream() // at most 1 and 2: what was queued is dropped
	t.Logf("the following connection got seqs %v, then was closed", got)
	r.idleStaysOpen()
}

// The session service started again: its publisher's first update is
// numbered from the stored bound, past numbers never published, and says
// so. The connections following the session are not closed for that gap;
// a gap between two updates of the new publisher still closes them.
func TestRenumberedUpdateIsNoGap(t *testing.T) {
	r := newLossRig(t, testenv.NATS(t))
	r.publish(1, false)
	r.publish(2, false)
	var err error
	if r.pub, err = bus.NewSessionUpdatePublisher(r.pubnc, r.sessionID, 1); err != nil { // the new process's
		t.Fatal(err)
	}
	r.publish(1025, false)
	r.publish(1026, false)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := readSeqs(t, r.followerClient, bufio.NewReader(r.followerClient), 4)
	if fmt.Sprint(got) != "[1 2 1025 1026]" {
		t.Fatalf("seqs %v", got)
	}
	select {
	case <-r.follower.conn.Done():
		t.Fatal("the following connection was closed for a renumbering")
	case <-time.After(100 * time.Millisecond):
	}
	// A hole after it is a loss.
	r.publish(1030, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		select {
		case <-r.follower.conn.Done():
			return nil
		default:
			return errors.New("still open after a gap")
		}
	})
	r.idleStaysOpen()
}
