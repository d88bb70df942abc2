package gateway

import (
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
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

	mu     sync.Mutex
	topics map[string]*topic // by session id
}

// topic is one session's subscription. Its own lock orders delivery, so
// sessions fan out in parallel.
type topic struct {
	sub   *nats.Subscription
	ready chan struct{} // closed once the subscription is in place at the server
	err   error         // set before ready closes when it could not be

	mu      sync.Mutex
	conns   map[*connState]struct{}
	lastSeq int64
}

func newHub(nc *nats.Conn, log *zap.Logger) *hub {
	return &hub{nc: nc, log: log, topics: map[string]*topic{}}
}

// errAttach wraps a failure to follow a session's updates.
var errAttach = errors.New("follow session updates")

// attach subscribes cs to the updates on subject, the update subject of
// sessionID as the session service returned it, and returns once the
// subscription is in place at the server (so the caller may start the
// turn whose updates it wants). Attaching twice is a no-op; it reports
// whether cs was attached before.
func (h *hub) attach(cs *connState, sessionID, subject string) (already bool, err error) {
	if id, err := bus.SessionOfSubject(subject); err != nil || id != sessionID {
		return false, fmt.Errorf("%w: subject %q does not name session %q", errAttach, subject, sessionID)
	}
	h.mu.Lock()
	t, ok := h.topics[sessionID]
	if !ok {
		t = &topic{conns: map[*connState]struct{}{}, ready: make(chan struct{})}
		t.sub, err = bus.SubscribeSessionUpdates(h.nc, subject, func(u bus.Update) { h.dispatch(t, u) },
			func(err error) {
				h.log.Warn("bad session update dropped", zap.String("session_id", sessionID), zap.Error(err))
			})
		if err != nil {
			h.mu.Unlock()
			return false, fmt.Errorf("%w: %w", errAttach, err)
		}
		// A burst of updates must not be cut by NATS's default pending
		// limits before the outboxes take them: the outboxes and the
		// write-stall rule bound what a connection holds.
		_ = t.sub.SetPendingLimits(-1, -1)
		h.topics[sessionID] = t
	}
	t.mu.Lock()
	_, already = t.conns[cs]
	t.conns[cs] = struct{}{}
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
		return false, fmt.Errorf("%w: %w", errAttach, t.err)
	}
	return already, nil
}

// attachNew is attach for a session the call that returned subject has
// just created (NewSession's created, not a resumed one). Its id may
// have named a session since deleted: a topic still held for the id is
// that session's, left until its deletion's update arrives, which under
// load may come after the new session's first attach. Joining that
// topic, the new session's connection was dropped with it, and its owner
// saw none of its turns. The topic is dropped first (its connections
// followed the deleted session, as the deletion's update would detach
// them) and the new session gets a topic of its own.
func (h *hub) attachNew(cs *connState, sessionID, subject string) (already bool, err error) {
	h.drop(sessionID)
	return h.attach(cs, sessionID, subject)
}

// attached reports whether cs follows the session.
func (h *hub) attached(cs *connState, sessionID string) bool {
	h.mu.Lock()
	t, ok := h.topics[sessionID]
	h.mu.Unlock()
	if !ok {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok = t.conns[cs]
	return ok
}

// detach removes cs from one session, or from all when sessionID is "".
func (h *hub) detach(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, t := range h.topics {
		if sessionID != "" && id != sessionID {
			continue
		}
		t.mu.Lock()
		delete(t.conns, cs)
		empty := len(t.conns) == 0
		t.mu.Unlock()
		if empty {
			_ = t.sub.Unsubscribe()
			delete(h.topics, id)
		}
	}
}

// drop detaches every connection from a session (it was deleted: its id
// may next name another principal's session).
func (h *hub) drop(sessionID string) { h.dropTopic(sessionID, nil) }

// dropTopic is drop of the session's topic if it is t (any, if t is nil):
// a deletion's update arriving on a topic attachNew has since replaced
// leaves the new session's topic alone.
func (h *hub) dropTopic(sessionID string, t *topic) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.topics[sessionID]; ok && (t == nil || cur == t) {
		_ = cur.sub.Unsubscribe()
		delete(h.topics, sessionID)
	}
}

func (h *hub) dispatch(t *topic, u bus.Update) {
	if u.Type == busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED {
		h.dropTopic(u.SessionID, t)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lastSeq != 0 && u.Seq > t.lastSeq+1 {
		h.log.Warn("session updates lost in transit", zap.String("session_id", u.SessionID),
			zap.Int64("after_seq", t.lastSeq), zap.Int64("got_seq", u.Seq))
	}
	if u.Seq > t.lastSeq {
		t.lastSeq = u.Seq
	}
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
	for cs := range t.conns {
		if u.ConnectionID != "" && u.ConnectionID != cs.id {
			continue
		}
		cs.outbox.push(u, n)
	}
}
