package gateway

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/bus"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// resendFunc is the session service's Resend.
type resendFunc func(ctx context.Context, req *sessionv1.ResendRequest, opts ...grpc.CallOption) (*sessionv1.ResendResponse, error)

// Bounds of a repair. Variables so that a test may change them.
var (
	// resendTimeout bounds the session service's answer.
	resendTimeout = 10 * time.Second
	// maxHeld bounds the updates of a session held while its missed
	// ones are fetched: past it, its followers are closed.
	maxHeld = 4096
)

// repairNow is repair for a caller that found the hole itself (the
// check after a reconnect, a prompt whose turn_complete never came):
// it reports false, leaving the followers to the caller, when another
// repair of t is under way or the hole cannot be filled.
func (h *hub) repairNow(t *topic, id string, after, upto int64, why string) bool {
	if h.resend == nil {
		return false
	}
	t.mu.Lock()
	if t.repairing || t.lastSeq > after {
		t.mu.Unlock()
		return false
	}
	t.repairing, t.held, t.heldOver = true, nil, false
	t.mu.Unlock()
	return h.repair(t, id, after, upto, why, false)
}

// repair has the session service rebuild the updates of t's session
// numbered past after up to upto (0: its last published one), which
// t's followers missed, and sends them before the updates held
// meanwhile; t.repairing is set. With cut, where the service says they cannot be
// rebuilt (a turn cut mid-stream, one still running, past its bounds),
// or it does not answer, the followers are closed, saying why, as
// before: a connection is never fed a stream with a hole in it (without
// cut, the caller closes them). Before, every hole closed them, a lone
// missed turn_complete included.
func (h *hub) repair(t *topic, id string, after, upto int64, why string, cut bool) bool {
	ctx, cancel := context.WithTimeout(h.ctx, resendTimeout)
	resp, err := h.resend(ctx, &sessionv1.ResendRequest{SessionId: id, Incarnation: t.incarnation, AfterSeq: after, UptoSeq: upto})
	cancel()
	var ups []bus.Update
	if err == nil && resp.GetLost() == "" {
		ups = make([]bus.Update, 0, len(resp.GetUpdates()))
		last := after
		for _, b := range resp.GetUpdates() {
			u, derr := bus.DecodeSessionUpdate(b, id, t.incarnation)
			if derr == nil && u.Seq <= last {
				derr = fmt.Errorf("update %d does not follow %d", u.Seq, last)
			}
			if derr != nil {
				err = fmt.Errorf("resent update: %w", derr)
				break
			}
			last = u.Seq
			ups = append(ups, u)
		}
		if err == nil && last != resp.GetUptoSeq() {
			err = fmt.Errorf("resent updates end at %d, not %d", last, resp.GetUptoSeq())
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	held := t.held
	t.repairing, t.held = false, nil
	// Nothing sent for a range the caller did not bound (a prompt's
	// missing turn_complete) proves nothing: the service has no more
	// than was received, so that turn_complete was never published.
	ok := err == nil && resp.GetLost() == "" && !t.heldOver && (len(ups) > 0 || upto != 0)
	switch {
	case ok:
		for _, u := range ups {
			if u.TurnStartedBy != "" {
				t.unmuteLocked(u.TurnStartedBy)
			}
			h.pushLocked(t, u)
		}
		t.lastSeq = max(t.lastSeq, resp.GetUptoSeq())
		t.resentTo = max(t.resentTo, resp.GetUptoSeq())
		h.log.Info("session updates missed were sent again", zap.String("session_id", id), zap.String("cause", why),
			zap.Int64("after_seq", after), zap.Int64("upto_seq", resp.GetUptoSeq()), zap.Int("updates", len(ups)))
	default:
		reason := resp.GetLost()
		switch {
		case err != nil:
			reason = "the session service did not send them again: " + err.Error()
		case t.heldOver:
			reason = fmt.Sprintf("more than %d updates came while the missed ones were fetched", maxHeld)
		case reason == "":
			reason = "the session service has no update past the last received"
		}
		h.log.Info("session updates missed cannot be sent again", zap.String("session_id", id), zap.String("cause", why),
			zap.Int64("after_seq", after), zap.Int64("upto_seq", upto), zap.String("reason", reason))
		for cs := range t.conns {
			if !cut {
				break
			}
			cs.outbox.cut("closing connection: "+why+", and they cannot be sent again", zap.String("session_id", id),
				zap.Int64("after_seq", after), zap.Int64("upto_seq", upto), zap.String("reason", reason))
		}
		if cut && upto > t.lastSeq {
			t.lastSeq = upto
		}
	}
	t.heldOver = false
	for _, u := range held {
		h.deliverLocked(t, u)
	}
	return ok
}
