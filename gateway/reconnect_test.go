package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/testenv"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// fakeSeqs is the session service's UpdateSeqs over the numbers a rig
// published (0 for a session it published nothing on), or err.
type fakeSeqs struct {
	mu   sync.Mutex
	last map[string]int64
	err  error
	// failures is how many calls fail (unavailable) before it answers;
	// unflushed, it answers as a service whose own bus link is down.
	failures  int
	unflushed bool
	calls     int
}

func (f *fakeSeqs) set(fn func(f *fakeSeqs)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeSeqs) published(sessionID string, seq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last = map[string]int64{}
	}
	f.last[sessionID] = max(f.last[sessionID], seq)
}

func (f *fakeSeqs) UpdateSeqs(_ context.Context, req *sessionv1.UpdateSeqsRequest, _ ...grpc.CallOption) (*sessionv1.UpdateSeqsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	if f.failures > 0 {
		f.failures--
		return nil, errors.New("session service unavailable")
	}
	// The rig's publisher flushes before the bus drop is undone.
	resp := &sessionv1.UpdateSeqsResponse{Flushed: !f.unflushed}
	for _, s := range req.GetSessions() {
		resp.Seqs = append(resp.Seqs, f.last[s.GetSessionId()])
	}
	return resp, nil
}

// rigSession is one more session on a lossRig's hub, with a connection
// following it.
type rigSession struct {
	r         *lossRig
	sessionID string
	pub       *bus.SessionUpdatePublisher
	cs        *connState
	client    net.Conn
	br        *bufio.Reader
}

// addSession follows one more session with a connection of its own;
// base is the session's last seq as the session service would have
// answered when it was followed (-1: not said).
func (r *lossRig) addSession(name string, base int64) *rigSession {
	r.t.Helper()
	s := &rigSession{r: r, sessionID: ids.New("s-")}
	s.cs, s.client = r.open(name)
	s.br = bufio.NewReader(s.client)
	r.t.Cleanup(func() {
		r.h.detach(s.cs, "")
		s.cs.outbox.close()
		s.cs.conn.Close()
		s.client.Close()
	})
	subject, err := bus.SessionUpdateSubject(s.sessionID, 1)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, _, err := r.h.attach(s.cs, s.sessionID, subject, base, true, false); err != nil {
		r.t.Fatal(err)
	}
	if s.pub, err = bus.NewSessionUpdatePublisher(r.pubnc, s.sessionID, 1); err != nil {
		r.t.Fatal(err)
	}
	return s
}

func (s *rigSession) publish(seq int64, last bool) { s.r.publishOn(s.pub, s.sessionID, seq, last) }

// readSeqs reads n updates from br and returns their seqs; the read is
// bounded for liveness only.
func readSeqs(t *testing.T, client net.Conn, br *bufio.Reader, n int) []int64 {
	t.Helper()
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []int64
	for len(got) < n {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("after seqs %v: %v", got, err)
		}
		var f struct {
			Params struct {
				Seq int64 `json:"seq"`
			} `json:"params"`
		}
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatalf("frame %q: %v", line, err)
		}
		got = append(got, f.Params.Seq)
	}
	return got
}

// dropGateway has the bus server drop the gateway's connection, waits
// until the gateway sees it, and returns a function that waits until it
// is back and its reconnect's check is done.
func (r *lossRig) dropGateway(srv *testenv.NATSServer) (back func()) {
	r.t.Helper()
	cid, err := r.gwnc.GetClientID()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := srv.Server().DisconnectClientByID(cid); err != nil {
		r.t.Fatal(err)
	}
	testenv.Eventually(r.t, 10*time.Second, time.Millisecond, func() error {
		if r.gwnc.IsConnected() {
			return errors.New("the gateway's bus connection was not seen dropped")
		}
		return nil
	})
	return func() {
		r.t.Helper()
		r.waitConnected()
		select {
		case <-r.checks:
		case <-time.After(30 * time.Second):
			r.t.Fatal("no check after the reconnect")
		}
	}
}

// isOpen reports whether cs's connection is still open.
func isOpen(cs *connState) bool {
	select {
	case <-cs.conn.Done():
		return false
	default:
		return true
	}
}

// The bus server drops the gateway's connection and takes it back, with
// nothing published meanwhile: the session service's last seq is the
// last one the follower received, so its stream has no hole; or, for a
// session followed after its last update, the one the service answered
// when it was followed. Both followers stay open and receive the next
// turn's updates. Before, every connection
// following a session was closed at every reconnect, a 50 ms blip
// included.
func TestBusBlipKeepsFollowersOfWholeStreams(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRigOn(t, srv.URL(), &fakeSeqs{})
	br := bufio.NewReader(r.followerClient)
	for seq := int64(1); seq <= 3; seq++ {
		r.publish(seq, seq == 3)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r.followerClient, br, 3); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("first turn: seqs %v", got)
	}

	// quiet is followed after its 7th update and has received nothing
	// since: the session service's number is still 7.
	quiet := r.addSession("quiet", 7)
	r.seqs.published(quiet.sessionID, 7)

	r.dropGateway(srv)()
	if !isOpen(r.follower) {
		t.Fatal("the follower of a session that lost nothing was closed at the reconnect")
	}
	if !isOpen(quiet.cs) {
		t.Fatal("the follower of a session that published nothing since it was followed was closed at the reconnect")
	}
	quiet.publish(8, true)
	for seq := int64(4); seq <= 6; seq++ {
		r.publish(seq, seq == 6)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r.followerClient, br, 3); fmt.Sprint(got) != "[4 5 6]" {
		t.Fatalf("next turn: seqs %v", got)
	}
	if got := readSeqs(t, quiet.client, quiet.br, 1); fmt.Sprint(got) != "[8]" {
		t.Fatalf("the quiet session's next turn: seqs %v", got)
	}
	if !isOpen(r.follower) || !isOpen(quiet.cs) {
		t.Fatal("a follower was closed")
	}
	r.idleStaysOpen()
}

// Three sessions are followed when the gateway's bus connection drops;
// one of them ends its turn meanwhile (its turn_complete lost, no later
// update shows the hole), one publishes its first update meanwhile. Their
// followers are closed; the third session's, whose stream lost nothing,
// stays open and receives its next turn.
func TestBusDropClosesOnlyFollowersOfStreamsWithAHole(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRigOn(t, srv.URL(), &fakeSeqs{})
	other := r.addSession("other", -1)
	r.publish(1, false)
	other.publish(1, false)
	other.publish(2, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(r.followerClient)
	if got := readSeqs(t, r.followerClient, br, 1); fmt.Sprint(got) != "[1]" {
		t.Fatalf("seqs %v", got)
	}
	if got := readSeqs(t, other.client, other.br, 2); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("other session: seqs %v", got)
	}

	// fresh has received nothing when the link drops: its first update,
	// published meanwhile, is lost, and no seq shows it.
	fresh := r.addSession("fresh", -1)

	back := r.dropGateway(srv)
	r.publish(2, false)
	r.publish(3, true)
	fresh.publish(1, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	back()

	_ = r.followerClient.SetReadDeadline(time.Now().Add(20 * time.Second))
	if line, err := br.ReadBytes('\n'); err == nil {
		t.Fatalf("the follower of the session that lost its turn's end got %s", line)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the follower of the session that lost its turn's end is still open")
	}

	_ = fresh.client.SetReadDeadline(time.Now().Add(20 * time.Second))
	if line, err := fresh.br.ReadBytes('\n'); err == nil {
		t.Fatalf("the follower of the session whose only update was lost got %s", line)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the follower of the session whose only update was lost is still open")
	}

	other.publish(3, false)
	other.publish(4, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, other.client, other.br, 2); fmt.Sprint(got) != "[3 4]" {
		t.Fatalf("other session's next turn: seqs %v", got)
	}
	if !isOpen(other.cs) {
		t.Fatal("the follower of the session that lost nothing was closed")
	}
	r.idleStaysOpen()
}

// shortAsks makes a check ask the session service again every 20 ms, and
// take an answer it does not get for 300 ms for none (and a flushed
// answer's updates not received for 300 ms for lost), for one test.
func shortAsks(t *testing.T) {
	again, unanswered, timeout := reconnectAskAgain, reconnectUnanswered, reconnectCheckTimeout
	reconnectAskAgain, reconnectUnanswered, reconnectCheckTimeout = 20*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	t.Cleanup(func() { reconnectAskAgain, reconnectUnanswered, reconnectCheckTimeout = again, unanswered, timeout })
}

// The session service cannot say what it published: every follower is
// closed, as before the check, rather than kept on a guess, once it has
// not answered for reconnectUnanswered.
func TestBusDropWithoutSessionServiceClosesFollowers(t *testing.T) {
	shortAsks(t)
	srv := testenv.StartNATS(t)
	r := newLossRigOn(t, srv.URL(), &fakeSeqs{err: errors.New("session service unavailable")})
	r.publish(1, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	r.dropGateway(srv)()
	got := r.followerStream()
	t.Logf("the following connection got seqs %v, then was closed", got)
	r.idleStaysOpen()
}

// A connection follows the session for a prompt not yet admitted (muted)
// when the gateway's bus connection drops; the turn's start, published
// meanwhile, is lost, and its updates come once the link is back. The
// turn_started has no seq, so no hole showed its loss: the prompting
// connection stayed muted, sent nothing of its own turn (its prompt then
// failed and every follower was closed, the turn_complete never written
// to it). The turn's first update names the connection too: the
// prompting connection gets the whole turn, and the other follower is
// kept with it.
func TestTurnStartLostOnTheBusUnmutesItsPrompterAtTheTurnsFirstUpdate(t *testing.T) {
	srv := testenv.StartNATS(t)
	r := newLossRigOn(t, srv.URL(), &fakeSeqs{})
	prompter, client := r.open("prompter")
	t.Cleanup(func() {
		r.h.detach(prompter, "")
		prompter.outbox.close()
		prompter.conn.Close()
		client.Close()
	})
	subject, err := bus.SessionUpdateSubject(r.sessionID, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A prompt's follow: muted until the turn it starts is announced.
	if _, _, err := r.h.attach(prompter, r.sessionID, subject, 0, false, false); err != nil {
		t.Fatal(err)
	}
	r.h.mu.Lock()
	topic := r.h.topics[r.sessionID]
	r.h.mu.Unlock()
	if !topic.isMuted(prompter) {
		t.Fatal("a prompt's follow is not muted")
	}

	back := r.dropGateway(srv)
	if err := r.pub.PublishTurnStarted(prompter.id); err != nil {
		t.Logf("turn start: %v", err)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	back()

	for seq := int64(1); seq <= 3; seq++ {
		r.publish(seq, seq == 3)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, client, bufio.NewReader(client), 3); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("the prompting connection got seqs %v", got)
	}
	br := bufio.NewReader(r.followerClient)
	if got := readSeqs(t, r.followerClient, br, 3); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("the other follower got seqs %v", got)
	}
	if !isOpen(prompter) || !isOpen(r.follower) {
		t.Fatal("a follower was closed")
	}
	r.idleStaysOpen()
}

// The session service does not answer at once when the gateway's bus
// link comes back (it is restarting), then answers its numbers, those
// the follower received: nothing was lost, and the follower stays.
// Before, the first failed call closed every follower.
func TestBusDropKeepsFollowersWhileTheSessionServiceRestarts(t *testing.T) {
	shortAsks(t)
	srv := testenv.StartNATS(t)
	seqs := &fakeSeqs{failures: 3}
	r := newLossRigOn(t, srv.URL(), seqs)
	br := bufio.NewReader(r.followerClient)
	r.publish(1, true)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r.followerClient, br, 1); fmt.Sprint(got) != "[1]" {
		t.Fatalf("seqs %v", got)
	}
	r.dropGateway(srv)()
	if !isOpen(r.follower) {
		t.Fatal("the follower of a session that lost nothing was closed while the session service restarted")
	}
	seqs.set(func(f *fakeSeqs) {
		if f.calls != 4 {
			t.Errorf("the session service was asked %d times, want 4 (3 unanswered)", f.calls)
		}
	})
	for seq := int64(2); seq <= 3; seq++ {
		r.publish(seq, seq == 3)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r.followerClient, br, 2); fmt.Sprint(got) != "[2 3]" {
		t.Fatalf("next turn: seqs %v", got)
	}
	r.idleStaysOpen()
}

// The session service's own bus link is down longer than the gateway's:
// when the gateway asks, it has published updates the follower has not
// received, which wait in its connection's buffer (its answer is not
// flushed), and it says so for longer than a flushed answer's deadline.
// Once its link is back they arrive: nothing was lost, and the follower
// stays and has them all, in order. Before, the follower was closed
// 10 s after the gateway's reconnect (reconnectCheckTimeout), nothing
// lost.
func TestBusDropKeepsFollowersWhileTheSessionServicesLinkIsDown(t *testing.T) {
	shortAsks(t)
	srv := testenv.StartNATS(t)
	seqs := &fakeSeqs{}
	r := newLossRigOn(t, srv.URL(), seqs)
	br := bufio.NewReader(r.followerClient)
	r.publish(1, false)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r.followerClient, br, 1); fmt.Sprint(got) != "[1]" {
		t.Fatalf("seqs %v", got)
	}
	// 2 and 3 are published, as far as the session service knows, and
	// wait in its buffer.
	seqs.set(func(f *fakeSeqs) { f.unflushed = true })
	seqs.published(r.sessionID, 3)
	back := r.dropGateway(srv)
	r.waitConnected()
	time.Sleep(3 * reconnectCheckTimeout)
	if !isOpen(r.follower) {
		t.Fatal("the follower was closed while the session service's updates waited in its buffer")
	}
	// Its link is back: the buffered updates go out, and it answers
	// flushed.
	for seq := int64(2); seq <= 3; seq++ {
		r.publish(seq, seq == 3)
	}
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	seqs.set(func(f *fakeSeqs) { f.unflushed = false })
	back()
	if got := readSeqs(t, r.followerClient, br, 2); fmt.Sprint(got) != "[2 3]" {
		t.Fatalf("the buffered updates: seqs %v", got)
	}
	if !isOpen(r.follower) {
		t.Fatal("the follower was closed")
	}
	r.idleStaysOpen()
}

// The session service's own bus link never comes back: it answers "not
// flushed", its numbers past what the follower received, at every ask.
// Past reconnectUnflushed from its first such answer the session is
// taken as having a hole: its follower is closed and the asking stops.
// Before, it was asked every reconnectAskAgain for as long as the
// gateway ran, and the follower was left open on a stream that had
// stopped.
func TestBusDropClosesFollowersOnceTheSessionServicesLinkStaysDown(t *testing.T) {
	shortAsks(t)
	bound := reconnectUnflushed
	reconnectUnflushed = 500 * time.Millisecond
	t.Cleanup(func() { reconnectUnflushed = bound })
	srv := testenv.StartNATS(t)
	seqs := &fakeSeqs{}
	r := newLossRigOn(t, srv.URL(), seqs)
	r.publish(1, false)
	if err := r.pubnc.Flush(); err != nil {
		t.Fatal(err)
	}
	seqs.set(func(f *fakeSeqs) { f.unflushed = true })
	seqs.published(r.sessionID, 3)
	r.dropGateway(srv)()
	if got := r.followerStream(); fmt.Sprint(got) != "[1]" {
		t.Fatalf("the follower got seqs %v", got)
	}
	var calls int
	seqs.set(func(f *fakeSeqs) { calls = f.calls })
	// At one ask every 20 ms, 500 ms is some 25 asks; the check has
	// ended (r.checks said so), so no more come.
	time.Sleep(10 * reconnectAskAgain)
	seqs.set(func(f *fakeSeqs) {
		if f.calls != calls {
			t.Errorf("the session service was asked %d times after the check ended", f.calls-calls)
		}
		if calls > 100 {
			t.Errorf("the session service was asked %d times within the bound", calls)
		}
	})
	r.idleStaysOpen()
}
