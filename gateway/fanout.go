package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// hub fans a session's updates from the bus out to every connection that
// prompted or attached to it: one subscription per session, shared by its
// connections, removed with the last of them. A connection is attached
// only on the subject the session service returned when it accepted the
// connection's principal (Attach, NewSession), never on a subject built
// from what the client sent.
type hub struct {
	nc  *nats.Conn
	log *zap.Logger

	// seqs asks the session service for the last update seq of
	// sessions (its UpdateSeqs) when the bus link comes back (see
	// reconnected); nil, every connection following a session is closed
	// then.
	seqs updateSeqsFunc
	// resend asks the session service to rebuild updates a session's
	// followers missed (its Resend; see repair); nil, they are closed.
	resend resendFunc
	// checked, when set (by a test, before the hub is used), is called
	// once a reconnect's check has settled every session.
	checked func()

	// ctx ends with the hub (close): the reconnect checks under way,
	// counted by checks, end with it.
	ctx    context.Context
	stop   context.CancelFunc
	checks sync.WaitGroup

	mu     sync.Mutex
	topics map[string]*topic // by session id, of its latest incarnation
	drops  int64             // how many times the bus link was seen down
}

// topic is one session's subscription. Its own lock orders delivery, so
// sessions fan out in parallel.
type topic struct {
	incarnation int64 // of the session, as its subject names it
	// base is the session's last update seq (UpdateSeqs's number) as the
	// session service answered the call that made the topic, before the
	// subscription was in place; -1 when not known. See reconnected.
	base  int64
	sub   *nats.Subscription
	ready chan struct{} // closed once the subscription is in place at the server
	err   error         // set before ready closes when it could not be

	mu sync.Mutex
	// conns are the connections following, each with whether it is kept:
	// followed by session/new, or relied on by a prompt that found it
	// followed. A follow only one prompt made, not kept, is undone when
	// the session service refuses that prompt (release).
	conns map[*connState]bool
	// muted are the connections of conns that follow the session only for
	// a prompt the session service has not admitted yet: they are sent
	// nothing until the session's UPDATE_TYPE_TURN_STARTED names them.
	// The gateway follows a session before it prompts it, so that the
	// turn's first chunk is not missed; a prompt refused SESSION_BUSY was
	// sent the running turn's updates meanwhile, someone else's turn.
	muted map[*connState]struct{}
	// lastSeq is the seq of the last update received, 0 before any. It
	// is kept across a reconnect of the bus link: reconnected compares it
	// with the session service's, and dispatch a later update with it.
	lastSeq int64
	// dropSeq is lastSeq when the bus link was last seen down, the drop
	// numbered dropGen (hub.drops): see disconnected.
	dropSeq, dropGen int64
	// repairing is set while missed updates are fetched (repair): the
	// updates received meanwhile wait in held (at most maxHeld; past
	// it, heldOver). resentTo is the last seq a repair sent: an update
	// published with a seq up to it was sent already.
	repairing bool
	heldOver  bool
	held      []bus.Update
	resentTo  int64
}

// has reports whether cs follows t.
func (t *topic) has(cs *connState) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.conns[cs]
	return ok
}

// newHub returns the hub of the gateway's bus connection nc. It adds its
// own to nc's disconnect and reconnect handlers: see disconnected and
// reconnected, which asks seqs.
func newHub(nc *nats.Conn, log *zap.Logger, seqs updateSeqsFunc) *hub {
	h := &hub{nc: nc, log: log, seqs: seqs, topics: map[string]*topic{}}
	h.ctx, h.stop = context.WithCancel(context.Background())
	if nc != nil {
		prevDown := nc.DisconnectErrHandler()
		nc.SetDisconnectErrHandler(func(nc *nats.Conn, err error) {
			if prevDown != nil {
				prevDown(nc, err)
			}
			h.disconnected()
		})
		prev := nc.ReconnectHandler()
		nc.SetReconnectHandler(func(nc *nats.Conn) {
			if prev != nil {
				prev(nc)
			}
			h.reconnected()
		})
	}
	return h
}

// turnLost closes the connections that follow the session when cs, one
// of them, waited in vain for the turn_complete of turn, a turn of its
// own prompt that ended (see awaitTurnComplete): nothing was queued for
// cs meanwhile, so the update never reached the session's topic, and
// none of them had it. It reports whether it closed them; a cs no longer
// following, or itself closed already (its backlog over the bound, say:
// the update may have reached the others), closes no one.
func (h *hub) turnLost(cs *connState, sessionID, turn string) bool {
	if cs.outbox.ended() {
		return false
	}
	h.mu.Lock()
	t, ok := h.topics[sessionID]
	h.mu.Unlock()
	if !ok {
		return false
	}
	t.mu.Lock()
	_, ok = t.conns[cs]
	after := t.lastSeq
	if after == 0 {
		after = t.base
	}
	t.mu.Unlock()
	if !ok {
		return false
	}
	// The session service may have it stored: its end, or the whole
	// turn, is sent again, and nobody is closed.
	if after >= 0 && h.repairNow(t, sessionID, after, 0, "a turn ended and its turn_complete never came") {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.conns[cs]; !ok {
		return false
	}
	for c := range t.conns {
		c.outbox.cut("closing connection: a turn ended and its turn_complete never came: session updates lost",
			zap.String("session_id", sessionID), zap.String("turn_id", turn))
	}
	return true
}

// errTurnLost is the prompt's error when turnLost closed its connection,
// in case the answer is written before the connection closes.
var errTurnLost = errors.New("the turn ended, but its session updates were lost on the bus; its transcript has it")

// errBusDown: the gateway's own bus link is down.
var errBusDown = errors.New("bus unavailable")

// busDown is the error of a call that would start or follow a session
// while the gateway's bus link is down, nil while it is up. Made anyway,
// session/new waited 10 s for the subscription, failed "gateway failed"
// and left the session it had made open, unknown to the client (one more
// at each retry); a prompt ran its turn, tools and all, for a client that
// could see none of it. Either is refused at once instead.
func (h *hub) busDown() error {
	if h.nc == nil || h.nc.IsConnected() {
		return nil
	}
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, errBusDown.Error())
}

// errAttach wraps a failure to follow a session's updates.
var errAttach = errors.New("follow session updates")

// errNotAtServer: the subscription was not confirmed by the bus server
// (its link went down, or the server hangs and the link is not yet seen
// down: busDown let the call through).
var errNotAtServer = fmt.Errorf("%w: the bus server did not confirm the subscription", errAttach)

// errReplaced: the session was deleted and its id names a new session.
var errReplaced = fmt.Errorf("%w: deleted and its id reused", errAttach)

// maxFollowed bounds the sessions one connection follows, each a topic
// and with the first connection a NATS subscription and its goroutine. A
// session closed or killed by another connection (or the durable bridge)
// stays followed until the connection ends; before the bound, two
// connections creating and closing sessions in a loop made the gateway
// hold 2,000 subscriptions and goroutines in 2,000 rounds, and any number
// more. A principal keeps at most 1,000 sessions open. A variable so
// that a test may lower it.
var maxFollowed = 2048

// errFollowLimit: the connection follows maxFollowed sessions.
func errFollowLimit() error {
	return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex,
		fmt.Sprintf("This connection follows %d sessions, the most one connection may; reconnect to follow others", maxFollowed))
}

// full reports whether cs follows maxFollowed sessions; a caller asks
// before it makes or resumes a session it would have cs follow.
func (h *hub) full(cs *connState) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return cs.following+cs.reserved >= maxFollowed
}

// reserve holds a follow for a session session/new is about to make, or
// reports false when cs follows (or has reserved) maxFollowed already.
// Checked only before the call, two session/new calls at the bound each
// made a session and the later one was refused -32001 for it, the session
// left made and unfollowed. The caller attaches with reserved set, and
// unreserves when done.
func (h *hub) reserve(cs *connState) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs.following+cs.reserved >= maxFollowed {
		return false
	}
	cs.reserved++
	return true
}

func (h *hub) unreserve(cs *connState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs.reserved--
}

// attach subscribes cs to the updates on subject, the update subject of
// sessionID as the session service returned it, and returns once the
// subscription is in place at the server (so the caller may start the
// turn whose updates it wants). Attaching twice is a no-op; it reports
// whether cs was attached before, and the incarnation subject names.
//
// The subject names the session's incarnation. A topic held for an
// earlier one is a deleted session's, kept until its deletion's update
// arrives, which under load comes after the id names a new session and
// its connections attach: it is dropped (its connections followed the
// deleted session, as that update would detach them) and the new one
// gets a topic of its own. A subject of an earlier incarnation than the
// topic's names a session deleted since the session service returned
// it: errReplaced.
//
// base is the session's last update seq as the session service answered
// (-1 when it did not say): kept by a topic made here, see reconnected.
func (h *hub) attach(cs *connState, sessionID, subject string, base int64, keep, reserved bool) (already bool, incarnation int64, err error) {
	id, incarnation, err := bus.SessionOfSubject(subject)
	if err != nil || id != sessionID {
		return false, 0, fmt.Errorf("%w: subject %q does not name session %q", errAttach, subject, sessionID)
	}
	h.mu.Lock()
	t, ok := h.topics[sessionID]
	switch {
	case ok && t.incarnation > incarnation:
		h.mu.Unlock()
		return false, 0, fmt.Errorf("%w: session %q", errReplaced, sessionID)
	case ok && t.incarnation < incarnation:
		h.dropLocked(sessionID, t)
		ok = false
	}
	if keep {
		delete(cs.leaving, sessionID) // followed again: see leave
	}
	others := cs.reserved // held by other calls: not this one's to take
	if reserved {
		others--
	}
	if cs.following+others >= maxFollowed && !(ok && t.has(cs)) {
		h.mu.Unlock()
		return false, 0, errFollowLimit()
	}
	if !ok {
		t = &topic{incarnation: incarnation, base: base, conns: map[*connState]bool{}, ready: make(chan struct{})}
		t.sub, err = bus.SubscribeSessionUpdates(h.nc, subject, func(u bus.Update) { h.dispatch(t, u) },
			func(err error) {
				h.log.Warn("bad session update dropped", zap.String("session_id", sessionID), zap.Error(err))
			})
		if err != nil {
			h.mu.Unlock()
			return false, 0, fmt.Errorf("%w: %w", errAttach, err)
		}
		// A burst of updates must not be cut by NATS's default pending
		// limits before the outboxes take them: the outboxes and the
		// write-stall rule bound what a connection holds.
		_ = t.sub.SetPendingLimits(-1, -1)
		h.topics[sessionID] = t
	}
	t.mu.Lock()
	// A follow found here was made by another call, which may be refused
	// and release it: this one relies on it, so it is kept.
	kept, already := t.conns[cs]
	t.conns[cs] = kept || keep || already
	if !already {
		cs.following++
	}
	switch {
	case keep:
		delete(t.muted, cs)
	case !already:
		// A prompt's follow: see muted.
		if t.muted == nil {
			t.muted = map[*connState]struct{}{}
		}
		t.muted[cs] = struct{}{}
	}
	t.mu.Unlock()
	h.mu.Unlock()

	if !ok {
		// The round trip that puts the subscription in place runs outside
		// the hub's lock: other sessions attach and fan out meanwhile.
		t.err = h.nc.Flush()
		close(t.ready)
	}
	<-t.ready
	if t.err != nil {
		h.detach(cs, sessionID)
		return false, 0, fmt.Errorf("%w: %w", errNotAtServer, t.err)
	}
	return already, incarnation, nil
}

// attached reports whether cs follows the session, and the incarnation
// it follows (the topic's: it may be of a session deleted a moment ago).
// A follow found is kept from then on: the prompt that asks relies on it.
func (h *hub) attached(cs *connState, sessionID string) (incarnation int64, ok bool) {
	h.mu.Lock()
	t, ok := h.topics[sessionID]
	h.mu.Unlock()
	if !ok {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok = t.conns[cs]; ok {
		t.conns[cs] = true
	}
	return t.incarnation, ok
}

// release undoes a follow of the session that a refused prompt made,
// unless it is kept: a second prompt on the connection that found it and
// was admitted, or a session/new, relies on it. Detaching regardless cut
// the admitted turn's updates, turn_complete included, from its own
// connection.
func (h *hub) release(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.topics[sessionID]; ok {
		h.detachLocked(cs, sessionID, t, true)
	}
}

// promptBegins and promptEnds bracket a prompt of cs on the session: see
// leave.
func (h *hub) promptBegins(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs.prompting == nil {
		cs.prompting = map[string]int{}
	}
	cs.prompting[sessionID]++
}

func (h *hub) promptEnds(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs.prompting[sessionID] > 1 {
		cs.prompting[sessionID]--
		return
	}
	delete(cs.prompting, sessionID)
	t, ok := h.topics[sessionID]
	switch {
	case cs.leaving[sessionID]:
		delete(cs.leaving, sessionID)
		if ok {
			h.detachLocked(cs, sessionID, t, false)
		}
	case ok && t.isMuted(cs):
		// No prompt of cs was admitted (its turn's start would have
		// unmuted it): the follow, kept by a prompt that relied on it
		// and was refused too, serves nobody.
		h.detachLocked(cs, sessionID, t, false)
	}
}

// unmuteLocked lets the connection connID, whose prompt started a turn,
// have the session's updates from here on; t.mu is held.
func (t *topic) unmuteLocked(connID string) {
	for cs := range t.muted {
		if cs.id == connID {
			delete(t.muted, cs)
		}
	}
}

// isMuted reports whether cs follows t only for a prompt not admitted.
func (t *topic) isMuted(cs *connState) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.muted[cs]
	return ok
}

// leave detaches cs from a session it closed or killed. While a prompt
// of cs on the session is in progress, it is detached once that prompt
// has ended instead: the close cancelled the prompt's turn, whose
// turn_complete the prompt waits for and may reach the gateway after the
// close's answer. Detached at once, the turn_complete went to nobody and
// the prompt answered without it, a turn wait later. A session/new of the
// session meanwhile follows it again (attach with keep).
func (h *hub) leave(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cs.prompting[sessionID] > 0 {
		if cs.leaving == nil {
			cs.leaving = map[string]bool{}
		}
		cs.leaving[sessionID] = true
		return
	}
	if t, ok := h.topics[sessionID]; ok {
		h.detachLocked(cs, sessionID, t, false)
	}
}

// detach removes cs from one session, or from all when sessionID is "".
func (h *hub) detach(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, t := range h.topics {
		if sessionID != "" && id != sessionID {
			continue
		}
		h.detachLocked(cs, id, t, false)
	}
}

// detachLocked removes cs from t (unless onlyUnkept and its follow is
// kept) and drops t once nobody follows it; h.mu is held.
func (h *hub) detachLocked(cs *connState, id string, t *topic, onlyUnkept bool) {
	t.mu.Lock()
	if kept, ok := t.conns[cs]; ok && !(onlyUnkept && kept) {
		delete(t.conns, cs)
		delete(t.muted, cs)
		cs.following--
	}
	empty := len(t.conns) == 0
	t.mu.Unlock()
	if empty {
		_ = t.sub.Unsubscribe()
		delete(h.topics, id)
	}
}

// dropLocked detaches every connection from the session's topic t, if it
// is still the session's (a deletion's update may come after a new
// session under the id has replaced it); h.mu is held.
func (h *hub) dropLocked(sessionID string, t *topic) {
	if cur, ok := h.topics[sessionID]; ok && cur == t {
		_ = cur.sub.Unsubscribe()
		delete(h.topics, sessionID)
		t.mu.Lock()
		for cs := range t.conns {
			cs.following--
		}
		clear(t.conns)
		clear(t.muted)
		t.mu.Unlock()
	}
}

func (h *hub) dispatch(t *topic, u bus.Update) {
	switch u.Type {
	case busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED:
		h.mu.Lock()
		h.dropLocked(u.SessionID, t)
		h.mu.Unlock()
		return
	case busv1.UpdateType_UPDATE_TYPE_TURN_STARTED:
		// Not a client's update, and without a seq: it lets the
		// connection whose prompt started the turn have the session's
		// updates from here on.
		t.mu.Lock()
		t.unmuteLocked(u.ConnectionID)
		t.mu.Unlock()
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.repairing {
		// Missed updates are being fetched (repair): this one waits
		// behind them, up to a bound.
		if len(t.held) < maxHeld {
			t.held = append(t.held, u)
		} else {
			t.heldOver = true
		}
		return
	}
	if t.lastSeq != 0 && u.Seq > t.lastSeq+1 && !u.Renumbered && h.resend != nil && len(t.conns) > 0 {
		// Updates were lost in transit: those the session service can
		// rebuild are sent first (repair), this one after them.
		t.repairing, t.held = true, append(t.held[:0], u)
		after, upto := t.lastSeq, u.Seq-1
		h.checks.Add(1)
		go func() {
			defer h.checks.Done()
			h.repair(t, u.SessionID, after, upto, "session updates lost in transit", true)
		}()
		return
	}
	h.deliverLocked(t, u)
}

// deliverLocked sends u, received on t's subscription, to t's followers;
// t.mu is held. A gap in seq before it closes them (dispatch tried to
// have the missed updates sent again before it came here).
func (h *hub) deliverLocked(t *topic, u bus.Update) {
	if u.Seq != 0 && u.Seq <= t.resentTo {
		// Sent already by a repair, which rebuilt it from the session
		// service's record before it was published.
		return
	}
	if u.TurnStartedBy != "" {
		// The turn's first update names its prompter too: a
		// turn_started lost on the bus (published while this link was
		// down, which no seq shows) left that connection muted, seeing
		// nothing of its own turn until the turn's end closed it.
		t.unmuteLocked(u.TurnStartedBy)
	}
	// A renumbered update is a publisher's first (the session service
	// started again): its seq follows the stored bound, and the numbers
	// it skips were never published.
	if t.lastSeq != 0 && u.Seq > t.lastSeq+1 && !u.Renumbered {
		// Updates were lost in transit: the connections following the
		// session are closed rather than fed a stream with a hole in it.
		for cs := range t.conns {
			cs.outbox.cut("closing connection: session updates lost in transit", zap.String("session_id", u.SessionID),
				zap.Int64("after_seq", t.lastSeq), zap.Int64("got_seq", u.Seq))
		}
	}
	if u.Seq > t.lastSeq {
		t.lastSeq = u.Seq
	}
	h.pushLocked(t, u)
}

// pushLocked queues u for each of t's followers it is for; t.mu is held.
func (h *hub) pushLocked(t *topic, u bus.Update) {
	if len(t.conns) == 0 {
		return
	}
	// Checked and measured once for every connection it goes to; each
	// send builds the frame in the buffer it writes.
	n, err := jsonrpc.EncodeRawNotification("session/update", u.JSON)
	if err != nil {
		h.log.Warn("session update not encodable, dropped", zap.String("session_id", u.SessionID),
			zap.Int64("seq", u.Seq), zap.Error(err))
		return
	}
	muted := len(t.muted) > 0
	for cs := range t.conns {
		if u.ConnectionID != "" && u.ConnectionID != cs.id {
			continue
		}
		if muted {
			if _, ok := t.muted[cs]; ok {
				continue
			}
		}
		cs.outbox.push(u, n)
	}
}
