package pluginsandbox

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// DefaultMaxSessions is channels.plugin.<alias>.max_sessions' default:
// the conversations of one channel kept open in the session service.
const DefaultMaxSessions = 256

// openConvs are the sessions one channel alias keeps open in the session
// service, by session id, in this replica. Every conversation (thread,
// else sender) has an operator session, and the session service bounds
// the operator's open sessions (1000, session.MaxOpenSessions) like any
// principal's: with nothing closing them, a holder of the channel's
// token who wrote on 1000 threads took them all, and the operator's own
// session/new failed, as did every other channel's new conversation.
// Past the alias's max_sessions, the least recently active conversation
// that no delivery holds is closed (its history kept: its next message
// reopens it). At most maxConversations deliveries run at once and
// max_sessions is at least that many, so there always is one.
type openConvs struct {
	mu     sync.Mutex
	seeded bool
	tick   uint64
	convs  map[string]*openConv
	// closing are the sessions being closed to make room, each until
	// its close returns: a message of that conversation meanwhile waits
	// for it, lest the close land after the message reopened it.
	closing map[string]chan struct{}
}

type openConv struct {
	last uint64 // tick of its last delivery's start or end
	busy int    // deliveries holding it
}

// convs returns the open conversations of alias.
func (s *Server) convs(alias string) *openConvs {
	s.convMu.Lock()
	defer s.convMu.Unlock()
	if s.openConvs == nil {
		s.openConvs = map[string]*openConvs{}
	}
	oc := s.openConvs[alias]
	if oc == nil {
		oc = &openConvs{convs: map[string]*openConv{}, closing: map[string]chan struct{}{}}
		s.openConvs[alias] = oc
	}
	return oc
}

// seed takes in, once per process, the sessions of the alias left open
// before it started (a restart, another replica's), oldest first: they
// count against the bound like the ones this replica opens.
func (oc *openConvs) seed(ctx context.Context, s *Server, b *binding) {
	oc.mu.Lock()
	seeded := oc.seeded
	oc.mu.Unlock()
	if seeded {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := s.cfg.Sessions.List(lctx, &sessionv1.ListRequest{Principal: channelPrincipal(), Limit: 1000})
	if err != nil {
		b.log.Warn("channel sessions not listed; those open before are not counted", zap.Error(err))
		return // tried again at the next message
	}
	surface := "channel:" + b.cfg.Alias
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.seeded {
		return
	}
	oc.seeded = true
	l := resp.GetSessions()
	for i := len(l) - 1; i >= 0; i-- { // newest first
		id := l[i].GetSessionId()
		if l[i].GetInteractionSurface() != surface || !strings.HasPrefix(id, "chan_") {
			continue
		}
		if _, ok := oc.convs[id]; !ok {
			oc.tick++
			oc.convs[id] = &openConv{last: oc.tick}
		}
	}
}

// hold marks id's conversation delivered now and returns the sessions to
// close to keep at most max open, least recently active first; the
// caller closes them (closeConvs).
func (oc *openConvs) hold(ctx context.Context, id string, max int) []string {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	for oc.closing[id] != nil {
		ch := oc.closing[id]
		oc.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		oc.mu.Lock()
		if ctx.Err() != nil {
			break
		}
	}
	oc.tick++
	c := oc.convs[id]
	if c == nil {
		c = &openConv{}
		oc.convs[id] = c
	}
	c.last = oc.tick
	c.busy++
	var out []string
	for len(oc.convs) > max {
		victim := ""
		var oldest uint64
		for vid, vc := range oc.convs {
			if vc.busy == 0 && (victim == "" || vc.last < oldest) {
				victim, oldest = vid, vc.last
			}
		}
		if victim == "" {
			break // every one is being delivered: cannot happen (see openConvs)
		}
		delete(oc.convs, victim)
		oc.closing[victim] = make(chan struct{})
		out = append(out, victim)
	}
	return out
}

// release ends a delivery's hold on id.
func (oc *openConvs) release(id string) {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	oc.tick++
	if c := oc.convs[id]; c != nil {
		c.busy--
		c.last = oc.tick
	}
}

// closeConvs closes the sessions hold made room for. Closed, not
// deleted: the session service keeps its history, and the conversation's
// next message reopens it (NewSession with its id). A close that fails
// is logged: the session service's own bound still holds.
func (oc *openConvs) closeConvs(ctx context.Context, s *Server, b *binding, ids []string) {
	for _, id := range ids {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		// A turn another replica runs on it (replicas share the
		// listener) is left alone: Close cancels a running turn.
		// That replica counts the conversation among its own.
		st, err := s.cfg.Sessions.State(cctx, &sessionv1.StateRequest{Principal: channelPrincipal(), SessionId: id})
		if err == nil && st.GetState() == sessionv1.SessionState_SESSION_STATE_IDLE {
			_, err = s.cfg.Sessions.Close(cctx, &sessionv1.CloseRequest{Principal: channelPrincipal(), SessionId: id})
		}
		cancel()
		switch {
		case err == nil && st.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE:
			// Running elsewhere, or closed already.
		case err != nil:
			b.log.Warn("channel conversation not closed", zap.String("session_id", id), zap.Error(err))
		default:
			b.log.Info("channel conversation closed to make room; its next message reopens it", zap.String("session_id", id))
		}
		oc.mu.Lock()
		close(oc.closing[id])
		delete(oc.closing, id)
		oc.mu.Unlock()
	}
}
