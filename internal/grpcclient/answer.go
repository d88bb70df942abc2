package grpcclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// A replica of a DialReplicas client with calls in flight is asked, on
// the connection they wait on, whether it answers: a health check once
// the calls have waited ProbeAfter with nothing heard from it, then
// every ProbeEvery while calls are in flight. A replica that leaves one
// unanswered for ProbeTimeout, and answers no other call on that
// connection meanwhile (one that does runs: starved or busy), is
// stopped or hung (SIGSTOP: its
// connection stays open, the kernel buffers what is sent, nothing
// answers): its calls in flight fail at once, Unavailable naming it,
// and it is not picked until a check answers (one waits on the
// connection at all times while it is hung). Its calls used to wait
// for the connection's keepalive (KeepaliveTime + KeepaliveTimeout, up
// to 15 s after the last frame read; gRPC pings no more often), and the
// calls picked on it meanwhile too. A call in flight longer than
// ProbeAfter (a plugin tool running) costs the replica one health check
// a second.
const (
	ProbeAfter   = 500 * time.Millisecond
	ProbeEvery   = time.Second
	ProbeTimeout = ConnectTimeout
)

// StoppedOrHung ends the words of a call's error when its replica
// accepted a connect or a call and then answered nothing within
// ConnectTimeout or ProbeTimeout.
const StoppedOrHung = "the process is stopped or hung"

// NotAnswering reports whether err is a call's that failed because its
// replica, or every replica, is stopped or hung.
func NotAnswering(err error) bool {
	return strings.Contains(status.Convert(err).Message(), StoppedOrHung)
}

// errNoAnswer is why a replica is hung: the cause of its calls' ends.
type errNoAnswer struct{ addr string }

func (e errNoAnswer) Error() string {
	return fmt.Sprintf("%s did not answer a health check within %v: %s", e.addr, ProbeTimeout, StoppedOrHung)
}

// call is one call through DialReplicas, in its context (callKey) for
// the picker to tie to the replica it picks (reachability.track), which
// ends it with errNoAnswer when that replica turns out hung.
type call struct {
	cancel context.CancelCauseFunc
}

type callKey struct{}

// watched is ctx made a call that its replica's hang can end; done(nil)
// releases it.
func watched(ctx context.Context) (_ context.Context, done context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	return context.WithValue(ctx, callKey{}, &call{cancel: cancel}), cancel
}

// ended is err, the call's, as the hang that ended it (Unavailable,
// rpcerr.ReasonDependency, naming the replica), when one did and the
// caller's ctx had not ended.
func ended(ctx, callCtx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	var no errNoAnswer
	if !errors.As(context.Cause(callCtx), &no) {
		return err
	}
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, no.Error())
}

// prober builds, for a SubConn, the grpc.ClientConnInterface that sends
// calls on its connection (gRPC's producer API, as its own health and
// load reports do): the probe must wait where the calls wait.
type prober struct{}

func (prober) Build(cc any) (balancer.Producer, func()) { return cc, func() {} }

// probe asks sc's replica whether it answers, within ProbeTimeout:
// answered is false when it did not; lost when the connection is gone
// or the client closing, which say nothing of the process.
func (r *reachability) probe(sc balancer.SubConn) (answered, lost bool) {
	p, release := sc.GetOrBuildProducer(prober{})
	defer release()
	cc, ok := p.(grpc.ClientConnInterface)
	if !ok {
		return true, true
	}
	ctx, cancel := context.WithTimeout(r.ctx, ProbeTimeout)
	defer cancel()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: grpcserver.Calls})
	switch {
	case r.ctx.Err() != nil:
		return false, true
	case err == nil:
		return true, false
	case status.Code(err) == codes.DeadlineExceeded && ctx.Err() != nil:
		return false, false
	case status.Code(err) == codes.Unavailable:
		return false, true
	}
	// An error answered is an answer.
	return true, false
}

// track ties the call in ctx (watched) to res's replica until its Done:
// the replica is probed while calls wait on it. It returns res, its
// Done wrapped, or ok false when the replica is hung: the picker tries
// another.
func (r *reachability) track(ctx context.Context, res balancer.PickResult) (balancer.PickResult, bool) {
	r.mu.Lock()
	rc := r.bySC[res.SubConn]
	if rc == nil {
		r.mu.Unlock()
		return res, true
	}
	if rc.hung {
		r.mu.Unlock()
		if res.Done != nil {
			// A pick not taken ends here for its child.
			res.Done(balancer.DoneInfo{Err: balancer.ErrNoSubConnAvailable})
		}
		return res, false
	}
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		r.mu.Unlock()
		return res, true
	}
	rc.calls[c] = struct{}{}
	r.probeLocked(rc)
	r.mu.Unlock()
	done := res.Done
	res.Done = func(d balancer.DoneInfo) {
		r.untrack(rc, c, d.BytesReceived)
		if done != nil {
			done(d)
		}
	}
	return res, true
}

func (r *reachability) untrack(rc *reach, c *call, heard bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(rc.calls, c)
	if heard {
		rc.heard = r.now()
	}
}

// probeLocked starts rc's prober unless it runs.
func (r *reachability) probeLocked(rc *reach) {
	if rc.probing || r.closed {
		return
	}
	rc.probing = true
	r.wg.Add(1)
	go r.prober(rc)
}

// prober probes rc while calls wait on it, or while it is hung, until
// its connection is lost, its SubConn shut down or the client closed.
func (r *reachability) prober(rc *reach) {
	defer r.wg.Done()
	t := time.NewTimer(ProbeAfter)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		_, live := r.conns[rc]
		if !live || len(rc.calls) == 0 && !rc.hung {
			rc.probing = false
			r.mu.Unlock()
			return
		}
		// Something heard lately is an answer already.
		if quiet := r.now().Sub(rc.heard); !rc.hung && quiet < ProbeAfter {
			r.mu.Unlock()
			t.Reset(ProbeAfter - quiet)
			continue
		}
		sc := rc.sc
		r.mu.Unlock()
		start := r.now()
		answered, lost := r.probe(sc)
		if lost {
			r.mu.Lock()
			rc.probing = false
			r.mu.Unlock()
			return
		}
		r.answered(rc, start, answered)
		if answered {
			t.Reset(ProbeEvery)
			continue
		}
		// Hung: a check always waits on the connection, so that the
		// replica's first answer once it runs again (SIGCONT) takes
		// it back, not the next check's. Not found hung for a call
		// answered meanwhile: checked again at once all the same.
		t.Reset(0)
	}
}

// answered records a probe of rc begun at start. A replica that did not
// answer, and answered no call on the connection since start either,
// is hung: away from start, not picked, and its calls in flight are
// ended, after the picker that leaves it is pushed (a call made again
// at once must not be picked on it). One that answers is back.
func (r *reachability) answered(rc *reach, start time.Time, answered bool) {
	r.mu.Lock()
	var end []*call
	changed := false
	switch {
	case answered:
		rc.heard = r.now()
		if rc.hung {
			rc.hung, rc.downSince, rc.err = false, time.Time{}, nil
			changed = true
		}
	case !rc.hung && rc.heard.After(start):
		// Unanswered, but a call on the connection was answered while
		// the check waited: the process runs (starved, or busy), it is
		// not stopped. The prober checks again at once, so each
		// ProbeTimeout of silence needs an answer of its own.
	case !rc.hung:
		rc.hung, rc.hungAt = true, r.now()
		if rc.downSince.IsZero() {
			rc.downSince = start
		}
		rc.err = errNoAnswer{addr: rc.addr}
		for c := range rc.calls {
			end = append(end, c)
		}
		clear(rc.calls)
		changed = true
	}
	r.armLocked()
	err := rc.err
	r.mu.Unlock()
	if !changed {
		return
	}
	r.wake()
	for _, c := range end {
		c.cancel(err)
	}
}
