package grpcclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/procstat"
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
// a second. When the client knows the replica's process (a Unix
// socket's peer, peer.go), a check still unanswered after StateAfter
// has its process's state read: a stopped process (state T) is hung at
// once, not after ProbeTimeout, and one whose CPU time grew while the
// check went unanswered runs (starved, busy or spinning) and is not
// hung: its calls wait on, but new ones go to a replica that answers
// while there is one (reach.slow).
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
// stopped: its process (pid) was seen stopped while the check waited,
// before ProbeTimeout.
type errNoAnswer struct {
	addr    string
	pid     int
	stopped bool
}

func (e errNoAnswer) Error() string {
	if e.stopped {
		return fmt.Sprintf("%s did not answer a health check, its process %d being stopped: %s", e.addr, e.pid, StoppedOrHung)
	}
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

// verdict is what a health check found of a replica.
type verdict int

const (
	checkAnswered verdict = iota
	// checkLost: the connection is gone or the client closing, which
	// say nothing of the process.
	checkLost
	// checkSilent: unanswered within ProbeTimeout, the process unknown
	// (no pid: TCP, another pid namespace) or not seen to run.
	checkSilent
	// checkRuns: unanswered, but the process ran meanwhile (its CPU
	// time grew): starved or busy, not hung.
	checkRuns
	// checkStopped: its process is stopped (state T), found while the
	// check waited (StateAfter), not at its end.
	checkStopped
)

// probe asks sc's replica whether it answers, within ProbeTimeout, and
// reads its process's state while the check waits (peer.go): a stopped
// one ends the check at once, unless hung (the replica is found so
// already: its check waits on, for the first answer once it runs
// again). It returns the process it asked, for the hang's words.
func (r *reachability) probe(sc balancer.SubConn, hung bool) (verdict, peerProc) {
	p, release := sc.GetOrBuildProducer(prober{})
	defer release()
	cc, ok := p.(grpc.ClientConnInterface)
	if !ok {
		return checkLost, peerProc{}
	}
	ctx, cancel := context.WithTimeout(r.ctx, ProbeTimeout)
	defer cancel()
	// A stream, not Invoke: its context names the connection's peer
	// (peerInfo) as soon as it is made, while the check waits.
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "Check"}, healthpb.Health_Check_FullMethodName)
	if err != nil {
		return r.judge(ctx, err), peerProc{}
	}
	proc := procOf(cs.Context())
	res := make(chan error, 1)
	go func() { res <- check(cs) }()
	t := time.NewTimer(StateAfter)
	defer t.Stop()
	var first procstat.Stat
	sampled := false
	for {
		select {
		case err := <-res:
			v := r.judge(ctx, err)
			if v == checkSilent && sampled {
				if st, ok := proc.sample(); ok {
					switch {
					case stopped(st):
						v = checkStopped
					case st.CPU > first.CPU:
						v = checkRuns
					}
				}
			}
			return v, proc
		case <-t.C:
		}
		st, ok := proc.sample()
		if !ok {
			// Not known, or gone: the check's own end decides.
			continue
		}
		if stopped(st) && !hung {
			cancel()
			<-res
			if r.ctx.Err() != nil {
				return checkLost, proc
			}
			return checkStopped, proc
		}
		if !sampled {
			first, sampled = st, true
		}
		t.Reset(StateAfter)
	}
}

// check is a unary health check of grpcserver.Calls on cs.
func check(cs grpc.ClientStream) error {
	if err := cs.SendMsg(&healthpb.HealthCheckRequest{Service: grpcserver.Calls}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	return cs.RecvMsg(new(healthpb.HealthCheckResponse))
}

// judge is a check's verdict from its error, its ctx that of probe.
func (r *reachability) judge(ctx context.Context, err error) verdict {
	switch {
	case r.ctx.Err() != nil:
		return checkLost
	case err == nil:
		return checkAnswered
	case status.Code(err) == codes.DeadlineExceeded && ctx.Err() != nil:
		return checkSilent
	case status.Code(err) == codes.Unavailable:
		return checkLost
	}
	// An error answered is an answer.
	return checkAnswered
}

// picked is what track made of a pick.
type picked int

const (
	pickTaken picked = iota
	// pickHung: its replica is stopped or hung; the picker tries
	// another.
	pickHung
	// pickSlow: its replica runs and answers nothing (reach.slow),
	// and slowOK was false; the picker tries another, and takes a slow
	// one only when no other is left.
	pickSlow
)

// track ties the call in ctx (watched) to res's replica until its Done:
// the replica is probed while calls wait on it. It returns res, its
// Done wrapped, and pickTaken; or pickHung when the replica is hung,
// pickSlow when it is slow and slowOK false: the picker tries another.
func (r *reachability) track(ctx context.Context, res balancer.PickResult, slowOK bool) (balancer.PickResult, picked) {
	r.mu.Lock()
	rc := r.bySC[res.SubConn]
	if rc == nil {
		r.mu.Unlock()
		return res, pickTaken
	}
	if !rc.hung && stops.nStopped.Load() != 0 {
		// Found stopped by another client of this process, or by this
		// one on another connection (stops.go): hung now, as its own
		// check would find it later.
		r.mu.Unlock()
		if proc, ok := stops.stoppedNow(rc.addr); ok {
			r.answered(rc, r.now(), checkStopped, proc)
		}
		r.mu.Lock()
	}
	if rc.hung || rc.slow && !slowOK {
		v := pickSlow
		if rc.hung {
			v = pickHung
		}
		// Its prober waits for its first answer once it runs again.
		r.probeLocked(rc)
		r.mu.Unlock()
		if res.Done != nil {
			// A pick not taken ends here for its child.
			res.Done(balancer.DoneInfo{Err: balancer.ErrNoSubConnAvailable})
		}
		return res, v
	}
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		r.mu.Unlock()
		return res, pickTaken
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
	return res, pickTaken
}

func (r *reachability) untrack(rc *reach, c *call, heard bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(rc.calls, c)
	if heard {
		rc.heard, rc.slow = r.now(), false
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

// prober probes rc while calls wait on it, or while it is hung or slow
// (so that its first answer takes it back), until
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
		if !live || len(rc.calls) == 0 && !rc.hung && !rc.slow {
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
		sc, hung := rc.sc, rc.hung
		r.mu.Unlock()
		start := r.now()
		v, proc := r.probe(sc, hung)
		switch v {
		case checkStopped:
			stops.record(rc.addr, proc, true)
		case checkAnswered:
			stops.runs(rc.addr, proc)
		}
		if v == checkLost {
			r.mu.Lock()
			rc.probing = false
			r.mu.Unlock()
			return
		}
		r.answered(rc, start, v, proc)
		if v == checkAnswered {
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

// answered records a probe of rc begun at start, its verdict v on the
// process proc. A replica whose process is stopped is hung; so is one
// that did not answer, answered no call on the connection since start
// either, and was not seen to run: away from start, not picked, and its
// calls in flight are ended, after the picker that leaves it is pushed
// (a call made again at once must not be picked on it). One that
// answers is back.
func (r *reachability) answered(rc *reach, start time.Time, v verdict, proc peerProc) {
	r.mu.Lock()
	var end []*call
	changed := false
	switch {
	case v == checkAnswered:
		rc.heard, rc.slow = r.now(), false
		if rc.hung {
			rc.hung, rc.downSince, rc.err = false, time.Time{}, nil
			changed = true
		}
	case v == checkStopped && !rc.hung:
		// Certain, whatever was heard: a stopped process answers
		// nothing more until it is continued.
	case !rc.hung && (rc.heard.After(start) || v == checkRuns):
		// Unanswered, but a call on the connection was answered while
		// the check waited, or the process ran: it runs (starved, or
		// busy), it is not stopped. The prober checks again at once,
		// so each ProbeTimeout of silence needs an answer, or a run,
		// of its own. One that ran and answered nothing is slow: a
		// process that spins (a livelock, handlers stuck while others
		// loop) runs and answers nothing just as a starved or busy one
		// does, and nothing the client sees tells them apart (its
		// transport answers pings in either; CPU grows in either; only
		// how long the silence lasts differs, and any bound on it would
		// end a starved process's calls). So its calls are not ended,
		// each waiting for its own deadline; but new calls go to a
		// replica that answers while there is one.
		rc.slow = !rc.heard.After(start)
		v = checkRuns
	}
	if !rc.hung && (v == checkStopped || v == checkSilent) {
		rc.hung, rc.hungAt = true, r.now()
		if rc.downSince.IsZero() {
			rc.downSince = start
		}
		rc.err = errNoAnswer{addr: rc.addr, pid: proc.pid, stopped: v == checkStopped}
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
