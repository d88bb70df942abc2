package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// updateSeqsFunc is the session service's UpdateSeqs.
type updateSeqsFunc func(ctx context.Context, req *sessionv1.UpdateSeqsRequest, opts ...grpc.CallOption) (*sessionv1.UpdateSeqsResponse, error)

// Bounds of the check a reconnect makes (reconnected). Variables so that
// a test may change them.
var (
	// reconnectCheckTimeout bounds the whole check: the round trip that
	// confirms the subscriptions, the session service's answers, and the
	// wait for updates published before its answer to arrive. A session
	// not proven whole by then has its followers closed.
	reconnectCheckTimeout = 10 * time.Second
	// reconnectBatch is how many sessions one UpdateSeqs call asks about
	// (the session service takes at most MaxUpdateSeqs), and
	// reconnectParallel how many calls are under way at once.
	reconnectBatch    = 500
	reconnectParallel = 4
	// reconnectPoll is how often a session behind the service's number is
	// looked at again while its updates arrive.
	reconnectPoll = 10 * time.Millisecond
	// reconnectAskAgain is how often the session service is asked again
	// while it cannot answer (restarting) or answers that its own bus
	// link is down (its updates wait in its connection's buffer: none is
	// lost yet). reconnectUnanswered bounds how long it may not answer: a
	// restart of the session service takes a few seconds; past the
	// bound, the followers it could not vouch for are closed.
	reconnectAskAgain   = time.Second
	reconnectUnanswered = 30 * time.Second
	// reconnectUnflushed bounds how long, from its first such answer,
	// the session service may answer that its own bus link is down
	// (not flushed): past it, the sessions it has not caught up on are
	// taken as lost. Unbounded, a service whose link never came back was
	// asked every second for as long as the gateway ran, its followers
	// left open on a stream that had stopped.
	reconnectUnflushed = 30 * time.Second
)

// followCheck is one session's part of the check: its topic, the last
// seq received before the link came back, and the connections that
// followed it then (those that follow it from a later attach never
// missed anything).
type followCheck struct {
	id    string
	t     *topic
	seen  int64
	conns []*connState
	want  int64 // the session service's number for the session
}

// reconnected checks, once the bus connection is back, which followed
// sessions lost updates while it was down, and closes the connections
// following those; the others stay. Updates published meanwhile went
// nowhere, and a connection is never fed a stream with a hole in it. A
// hole in the middle shows in seq (dispatch checks it, as lastSeq is
// kept across the outage); a lost tail (a turn's last updates, its
// turn_complete among them) shows in nothing the gateway receives, which
// is why the session service is asked for the last seq each session
// published (UpdateSeqs):
//
//   - a session whose last update received is that number, or past it,
//     lost nothing: an update published after the service's answer is
//     received on the subscriptions nats.go put back, whose place at the
//     server a round trip confirms before asking.
//   - one behind it is waited for, as updates published before the answer
//     may still be on their way. When the service says they all reached
//     the bus server (flushed), a round trip of the gateway's own puts
//     them in the subscriptions' queues, and a session still behind once
//     its queue is empty lost them; otherwise (the service's own link is
//     down, its updates buffered) until reconnectCheckTimeout.
//   - one whose number is the one the session service answered when the
//     session was followed (topic.base) published nothing since, and
//     lost nothing: an idle session followed, say, and not prompted yet.
//   - one that received nothing since it was followed (before the drop:
//     see disconnected) but published something cannot be told from one
//     whose every update was lost.
//
// While the session service's own bus link is down (its answer not
// flushed), its updates wait in its connection's buffer and none is lost
// yet: it is asked again every reconnectAskAgain while it says so, up to
// reconnectUnflushed from its first such answer, and the sessions it has
// not caught up on stay pending meanwhile, their followers open; past
// that bound they are handled as a hole (one line logged for the batch).
// Closed at a fixed 10 s, the followers of every session
// it had published on were closed with nothing lost whenever its link
// took longer to come back than the gateway's. An unanswered call (the
// service restarting) is made again too, up to reconnectUnanswered: a
// service that restarted and published nothing since answers its stored
// numbers, and the followers of sessions it lost nothing of stay. A new
// drop of the gateway's link ends the check: the next reconnect's check
// takes its sessions over, from what they received by that drop
// (droppedAgain).
//
// Anything not proven whole (the service unreachable or not flushed
// past its bound, or answering -1, the deadline of a flushed answer
// passed) has its
// followers closed, as every follower was before this check: closing
// every connection at each reconnect made a 50 ms blip of the bus end
// every client's connection. The check runs apart from nats.go's
// callback goroutine and from dispatch, which goes on delivering
// meanwhile. Connections that follow nothing stay open.
func (h *hub) reconnected() {
	h.mu.Lock()
	checks := make([]*followCheck, 0, len(h.topics))
	for id, t := range h.topics {
		t.mu.Lock()
		if len(t.conns) > 0 {
			// What was received before the drop: lastSeq now may count
			// an update received on the subscription put back, and one
			// that was the first since the session was followed passed
			// no check of seq (see disconnected).
			seen := int64(0)
			if t.dropGen == h.drops {
				seen = t.dropSeq
			}
			c := &followCheck{id: id, t: t, seen: seen, conns: make([]*connState, 0, len(t.conns))}
			for cs := range t.conns {
				c.conns = append(c.conns, cs)
			}
			checks = append(checks, c)
		}
		t.mu.Unlock()
	}
	gen := h.drops
	h.checks.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.checks.Done()
		h.checkFollows(checks, gen)
	}()
}

// droppedAgain reports whether the bus link went down again since the
// drop numbered gen, or is down now: the check of the reconnect that
// follows takes the sessions over, from what they received by then.
// Closing their followers for it instead closed them, nothing lost, at
// every drop that came while a check was under way.
func (h *hub) droppedAgain(gen int64) bool {
	if !h.nc.IsConnected() {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.drops != gen
}

// close ends the reconnect checks under way, their followers left as
// they are (the gateway is stopping), and waits for them.
func (h *hub) close() {
	h.stop()
	h.checks.Wait()
}

// disconnected notes each topic's place in its stream as the bus link
// goes down, for reconnected to start from. nats.go queues it before
// its first attempt to reconnect, which natsutil's delay puts 100 ms or
// more later (none when natsutil forces a reconnect, a round trip
// later), so it runs before any update comes on the subscriptions put
// back. A topic that finds no note of the last drop counts as having
// received nothing: its followers are closed unless its session never
// published anything.
func (h *hub) disconnected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.drops++
	for _, t := range h.topics {
		t.mu.Lock()
		t.dropSeq, t.dropGen = t.lastSeq, h.drops
		t.mu.Unlock()
	}
}

// checkFollows is reconnected's check of checks after the drop numbered
// gen, reconnectParallel calls at a time.
func (h *hub) checkFollows(checks []*followCheck, gen int64) {
	if h.checked != nil {
		defer h.checked()
	}
	if len(checks) == 0 {
		return
	}
	if h.seqs == nil {
		h.loseAll(checks)
		return
	}
	// The subscriptions nats.go sent again on reconnecting are in place
	// at the server once this round trip is done.
	fctx, cancel := context.WithTimeout(h.ctx, reconnectCheckTimeout)
	err := h.nc.FlushWithContext(fctx)
	cancel()
	if h.ctx.Err() != nil || err != nil && h.droppedAgain(gen) {
		return
	}
	if err != nil {
		h.log.Warn("bus subscriptions not confirmed after a reconnect: the connections following sessions are closed", zap.Error(err))
		h.loseAll(checks)
		return
	}
	sem := make(chan struct{}, reconnectParallel)
	var wg sync.WaitGroup
	for len(checks) > 0 {
		batch := checks[:min(len(checks), reconnectBatch)]
		checks = checks[len(batch):]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h.checkBatch(batch, gen)
		}()
	}
	wg.Wait()
}

// errSeqsCount: UpdateSeqs answered a number of seqs other than asked.
var errSeqsCount = errors.New("UpdateSeqs answered for another number of sessions than asked")

// checkBatch asks the session service about batch and settles each of
// its sessions: kept, or its followers closed; or leaves them to a later
// check, when the gateway's link went down again (gen is the drop this
// check follows: see droppedAgain).
func (h *hub) checkBatch(batch []*followCheck, gen int64) {
	kept, pending := 0, batch
	defer func() {
		if kept > 0 {
			h.log.Info("sessions followed across a bus reconnect lost no update: their followers stay", zap.Int("sessions", kept))
		}
	}()
	unanswered := time.Now().Add(reconnectUnanswered)
	var unflushed time.Time // the bound of not-flushed answers, from the first
	for len(pending) > 0 {
		resp, err := h.askSeqs(pending)
		switch {
		case h.ctx.Err() != nil:
			return
		case err != nil && !errors.Is(err, errSeqsCount) && time.Now().Before(unanswered):
			h.log.Debug("session update seqs not read after a bus reconnect: asked again", zap.Error(err))
		case err != nil:
			h.log.Warn("session update seqs not read after a bus reconnect: the connections following the sessions are closed",
				zap.Int("sessions", len(pending)), zap.Error(err))
			h.loseAll(pending)
			return
		case resp.GetFlushed():
			kept += h.settle(pending, resp.GetSeqs(), gen)
			return
		default:
			// The session service's own link is down: what it published
			// up to its numbers waits in its buffer, not lost (or, if
			// its buffer refused some, a hole its next answer shows).
			// Only what is proven now is settled.
			for i, c := range pending {
				c.want = resp.GetSeqs()[i]
			}
			var n int
			n, pending = h.settleSoFar(pending)
			kept += n
			now := time.Now()
			unanswered = now.Add(reconnectUnanswered)
			if unflushed.IsZero() {
				unflushed = now.Add(reconnectUnflushed)
			} else if len(pending) > 0 && !now.Before(unflushed) {
				// Once, for the batch: its updates are still not at the
				// bus server, and may never be.
				h.log.Warn("the session service's bus link stayed down after the gateway's came back: the connections following the sessions it has not caught up on are closed",
					zap.Int("sessions", len(pending)), zap.Duration("waited", reconnectUnflushed))
				// Not sent again from what the session service stored:
				// a turn still running there is stored up to now, and
				// its later updates, its end among them, would wait in
				// that buffer with nothing here watching for them.
				for _, c := range pending {
					h.cut(c)
				}
				return
			}
		}
		if len(pending) == 0 {
			return
		}
		select {
		case <-h.ctx.Done():
			return
		case <-time.After(reconnectAskAgain):
		}
		if h.droppedAgain(gen) {
			return
		}
	}
}

// askSeqs is one UpdateSeqs call about checks.
func (h *hub) askSeqs(checks []*followCheck) (*sessionv1.UpdateSeqsResponse, error) {
	req := &sessionv1.UpdateSeqsRequest{Sessions: make([]*sessionv1.SessionIncarnation, len(checks))}
	for i, c := range checks {
		req.Sessions[i] = &sessionv1.SessionIncarnation{SessionId: c.id, Incarnation: c.t.incarnation}
	}
	ctx, cancel := context.WithTimeout(h.ctx, reconnectCheckTimeout)
	defer cancel()
	resp, err := h.seqs(ctx, req)
	if err == nil && len(resp.GetSeqs()) != len(checks) {
		err = errSeqsCount
	}
	return resp, err
}

// settleSoFar keeps or closes the followers of each of checks that
// c.want, the number the session service answered without having
// flushed, proves whole or not known, and returns how many it kept and
// the rest.
func (h *hub) settleSoFar(checks []*followCheck) (kept int, rest []*followCheck) {
	rest = checks[:0:0]
	for _, c := range checks {
		switch h.judge(c, false) {
		case whole:
			kept++
		case behind:
			rest = append(rest, c)
		}
	}
	return kept, rest
}

// A verdict is judge's.
type verdict int

const (
	behind verdict = iota // not all received yet, none known lost
	whole
	lost // its followers closed
)

// judge tells what c.want proves of c's stream, and closes its followers
// when it is lost; drained says its subscription's queue was seen empty
// (before c's seq is read: a queue seen empty holds nothing the seq read
// after it has not counted) once the service's updates up to c.want were
// at the bus server and a round trip of the gateway's was done.
func (h *hub) judge(c *followCheck, drained bool) verdict {
	switch {
	case c.want >= 0 && c.want == c.t.base:
		// The session published nothing since before it was followed:
		// there was nothing to lose.
		return whole
	case c.want < 0, c.seen == 0 && c.want != 0:
		// Not known, or nothing received since the session was
		// followed: a stream whose every update was lost looks the
		// same.
		h.lose(c)
		return lost
	case c.t.seq() >= c.want:
		// Every update up to the number was received: a hole among
		// them, dispatch closed the followers for.
		return whole
	case drained:
		h.lose(c)
		return lost
	}
	return behind
}

// settle keeps or closes the followers of each of checks, given seqs,
// the numbers the session service answered once every update up to them
// was at the bus server (flushed), within reconnectCheckTimeout; or
// leaves them to a later check (droppedAgain).
func (h *hub) settle(checks []*followCheck, seqs []int64, gen int64) (kept int) {
	ctx, cancel := context.WithTimeout(h.ctx, reconnectCheckTimeout)
	defer cancel()
	for i, c := range checks {
		c.want = seqs[i]
	}
	// With every update up to the numbers at the bus server, this round
	// trip puts every one of them the server sent here in the
	// subscriptions' queues: what is not received once those are empty
	// was lost.
	if err := h.nc.FlushWithContext(ctx); err != nil {
		if h.ctx.Err() != nil || h.droppedAgain(gen) {
			return 0
		}
		h.log.Warn("bus link lost again while checking the sessions followed: the connections following them are closed", zap.Error(err))
		h.loseAll(checks)
		return 0
	}
	tick := time.NewTicker(reconnectPoll)
	defer tick.Stop()
	pending := checks
	for len(pending) > 0 {
		later := pending[:0]
		for _, c := range pending {
			switch h.judge(c, c.t.drained()) {
			case whole:
				kept++
			case behind:
				later = append(later, c)
			}
		}
		pending = later
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			if h.ctx.Err() != nil {
				return kept
			}
			for _, c := range pending {
				h.lose(c)
			}
			pending = nil
		case <-tick.C:
		}
	}
	return kept
}

// drained reports whether t's subscription has no update queued or in
// dispatch (nats.go counts one pending until its handler returns). A
// closed subscription (the topic dropped meanwhile) is drained.
func (t *topic) drained() bool {
	n, _, err := t.sub.Pending()
	return err != nil || n == 0
}

// seq is the last update seq t received.
func (t *topic) seq() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastSeq
}

// loseAll is lose of every check, none of whose numbers is known.
func (h *hub) loseAll(checks []*followCheck) {
	for _, c := range checks {
		c.want = -1
		h.lose(c)
	}
}

// lose closes the connections of c that still follow its session, and
// moves the session's stream place to c.want, the session service's
// number (or forgets it, when not known), so that a connection following
// it from a later attach is not closed for the hole when the next update
// comes.
func (h *hub) lose(c *followCheck) {
	// What the session service stored of the updates missed (a turn's
	// end, whole turns) is sent again instead, when it covers them all.
	if after := c.resumeFrom(); c.want > 0 && after >= 0 && after < c.want &&
		h.repairNow(c.t, c.id, after, c.want, "session updates missed while the bus was disconnected") {
		return
	}
	h.cut(c)
}

// cut is lose without the resend: c's followers are closed.
func (h *hub) cut(c *followCheck) {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	switch {
	case c.want < 0:
		c.t.lastSeq = 0
	case c.want > c.t.lastSeq:
		c.t.lastSeq = c.want
	}
	for _, cs := range c.conns {
		if _, ok := c.t.conns[cs]; ok {
			cs.outbox.cut("closing connection: session updates may have been lost while the bus was disconnected",
				zap.String("session_id", c.id), zap.Int64("received_seq", c.seen), zap.Int64("published_seq", c.want))
		}
	}
}

// resumeFrom is the last update of c's session its followers are known
// to have, from which the updates missed may be sent again: the last
// received, or when none was received since the session was followed,
// the number the session service answered then (-1 when not known; or
// when updates came after the reconnect only, unchecked: lastSeq was 0).
func (c *followCheck) resumeFrom() int64 {
	seq := c.t.seq()
	switch {
	case c.seen != 0:
		return seq
	case seq == 0:
		return c.t.base
	}
	return -1
}
