package gateway

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/subjects"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// hub fans a session's updates from NATS out to every connection that
// prompted or attached to it: one NATS subscription per session, shared by
// its connections, removed with the last of them.
type hub struct {
	nc  *nats.Conn
	log *zap.Logger

	mu     sync.Mutex
	topics map[string]*topic
}

type topic struct {
	sub     *nats.Subscription
	conns   map[*connState]struct{}
	lastSeq int64
}

func newHub(nc *nats.Conn, log *zap.Logger) *hub {
	return &hub{nc: nc, log: log, topics: map[string]*topic{}}
}

// attach subscribes cs to the session's updates; attaching twice is a
// no-op. It reports whether cs was attached before.
func (h *hub) attach(cs *connState, sessionID string) (already bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.topics[sessionID]
	if !ok {
		t = &topic{conns: map[*connState]struct{}{}}
		t.sub, err = h.nc.Subscribe(subjects.SessionUpdate(sessionID), func(m *nats.Msg) { h.dispatch(sessionID, m) })
		if err != nil {
			return false, fmt.Errorf("subscribe session updates: %w", err)
		}
		// A burst of updates must not be cut by NATS's default pending
		// limits before the outboxes take them.
		_ = t.sub.SetPendingLimits(-1, -1)
		// Flush so the subscription is in place before the caller starts
		// the turn whose updates it wants.
		if err := h.nc.Flush(); err != nil {
			_ = t.sub.Unsubscribe()
			return false, fmt.Errorf("subscribe session updates: %w", err)
		}
		h.topics[sessionID] = t
	}
	_, already = t.conns[cs]
	t.conns[cs] = struct{}{}
	return already, nil
}

// detach removes cs from one session, or from all when sessionID is "".
func (h *hub) detach(cs *connState, sessionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, t := range h.topics {
		if sessionID != "" && id != sessionID {
			continue
		}
		delete(t.conns, cs)
		if len(t.conns) == 0 {
			_ = t.sub.Unsubscribe()
			delete(h.topics, id)
		}
	}
}

func (h *hub) dispatch(sessionID string, m *nats.Msg) {
	var u sessionv1.Update
	if err := proto.Unmarshal(m.Data, &u); err != nil {
		h.log.Warn("undecodable session update", zap.String("session_id", sessionID), zap.Error(err))
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.topics[sessionID]
	if !ok {
		return
	}
	if t.lastSeq != 0 && u.GetSeq() > t.lastSeq+1 {
		h.log.Warn("session updates lost in transit", zap.String("session_id", sessionID),
			zap.Int64("after_seq", t.lastSeq), zap.Int64("got_seq", u.GetSeq()))
	}
	if u.GetSeq() > t.lastSeq {
		t.lastSeq = u.GetSeq()
	}
	for cs := range t.conns {
		if u.GetConnectionId() != "" && u.GetConnectionId() != cs.id {
			continue
		}
		cs.outbox.push(&u)
	}
}
