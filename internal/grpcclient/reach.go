package grpcclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// RestartGrace is how long every replica of a DialReplicas client may
// fail to connect before its calls stop waiting for one and fail
// Unavailable NoReplicaReachable. A replica the launcher restarts is
// away (its socket missing or refusing) for the restart's backoff, 100
// ms doubling to 10 s on a crash within 30 s of the last start, and
// the time its new process takes to listen: 0.2 to 0.5 s for a first
// restart, measured (docs/performance.md, "Sixty-second round: a
// sandbox gone for good"). The grace covers a restart after a few
// crashes in a row (backoff 1.6 s) on a loaded machine; a replica that
// connects but is still starting (health NOT_SERVING) is waited for
// within the call's deadline whatever its time. A replica that is hung
// (its socket accepts, in the kernel's backlog, and nothing answers) is
// away from the start of its first connect that timed out
// (ConnectTimeout), so calls fail RestartGrace after that start; one
// whose process the connect finds stopped (peer.go) fails the connect
// at once and counts as gone at once, as a hung one. One
// hung with its connection open is away from the start of the health
// check it left unanswered (answer.go), and counts as gone at once: it
// is not restarting.
const RestartGrace = 3 * time.Second

// NoReplicaReachable begins the message of a call through DialReplicas
// made or waiting while every replica failed to connect for longer
// than RestartGrace. The status is Unavailable with
// rpcerr.ReasonDependency, which the gateway shows as
// "<service>: no replica is reachable (...)".
const NoReplicaReachable = "no replica is reachable"

// reach is what the balancer knows of one address's connection: since
// when it has failed to connect (zero while connected, connecting for
// the first time, or not failed since it last was), counted from the
// start of the first attempt that failed, and the last failure's error.
type reach struct {
	addr      string
	sc        balancer.SubConn
	trying    time.Time // the start of the attempt under way, or of the last
	downSince time.Time
	err       error

	// hung: connected, and a health check on the connection went
	// unanswered since hungAt (answer.go); until one answers or the
	// connection is lost.
	hung   bool
	hungAt time.Time
	// stopped: its last connect found its process stopped (peer.go),
	// since hungAt; until a connect gets through, or fails otherwise.
	// Gone at once, as hung.
	stopped bool
	// heard is when a call on the connection last had an answer.
	heard time.Time
	// slow: its last check went unanswered while its process ran
	// (checkRuns), and nothing on the connection has been answered
	// since: starved, busy or spinning, which the client cannot tell
	// apart. Not hung, its calls not ended; but a call is picked on
	// it only when every other replica is hung or slow (methodPicker).
	slow bool
	// calls are the calls in flight on the connection (track), as many
	// as the client makes at once; probing, whether its prober runs.
	calls   map[*call]struct{}
	probing bool
}

// reachability follows the connections of a balancer's addresses and
// tells when every one has failed to connect for longer than grace.
// Its methods are called by gRPC's serializer (the state listeners,
// UpdateState) and by its own timer, under mu.
type reachability struct {
	grace time.Duration
	now   func() time.Time
	// wake is called, without mu held, once every address has been
	// away for grace: the balancer pushes a picker that fails calls.
	wake func()

	// ctx ends at close: the probers' calls, then the probers (wg).
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	conns  map[*reach]struct{} // one a SubConn, removed at its Shutdown
	bySC   map[balancer.SubConn]*reach
	timer  *time.Timer
	closed bool
}

func newReachability(grace time.Duration, wake func()) *reachability {
	ctx, stop := context.WithCancel(context.Background())
	return &reachability{grace: grace, now: time.Now, wake: wake, ctx: ctx, stop: stop,
		conns: map[*reach]struct{}{}, bySC: map[balancer.SubConn]*reach{}}
}

// listen returns opts with a state listener that records the SubConn's
// connection before handing its state to the listener opts had, and
// the record's removal, for a SubConn that could not be made.
func (r *reachability) listen(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.NewSubConnOptions, *reach, func()) {
	rc := &reach{calls: map[*call]struct{}{}}
	if len(addrs) > 0 {
		rc.addr = addrs[0].Addr
	}
	r.mu.Lock()
	if !r.closed {
		r.conns[rc] = struct{}{}
	}
	r.mu.Unlock()
	next := opts.StateListener
	opts.StateListener = func(s balancer.SubConnState) {
		r.update(rc, s)
		if next != nil {
			next(s)
		}
	}
	return opts, rc, func() { r.update(rc, balancer.SubConnState{ConnectivityState: connectivity.Shutdown}) }
}

// bind ties rc to its SubConn, for the picker (track) and the prober.
func (r *reachability) bind(rc *reach, sc balancer.SubConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.conns[rc]; ok {
		rc.sc = sc
		r.bySC[sc] = rc
	}
}

func (r *reachability) update(rc *reach, s balancer.SubConnState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s.ConnectivityState {
	case connectivity.Ready:
		rc.downSince, rc.err, rc.hung, rc.stopped = time.Time{}, nil, false, false
	case connectivity.Connecting:
		rc.trying = r.now()
	case connectivity.TransientFailure:
		// Away since the attempt began: a refused connect fails at
		// once, but a replica that is hung (stopped: its socket still
		// accepts, in the kernel's backlog, and nothing answers) fails
		// only at the connect's deadline (ConnectTimeout), which
		// counted from here would have kept calls waiting that much
		// past the grace.
		if rc.downSince.IsZero() {
			rc.downSince = rc.trying
			if rc.downSince.IsZero() {
				rc.downSince = r.now()
			}
		}
		rc.err = s.ConnectionError
		if isPeerStopped(rc.err) && !rc.stopped {
			rc.stopped, rc.hungAt = true, r.now()
		} else if !isPeerStopped(rc.err) {
			rc.stopped = false
		}
	case connectivity.Shutdown:
		delete(r.conns, rc)
		if rc.sc != nil {
			delete(r.bySC, rc.sc)
		}
		clear(rc.calls)
	}
	if s.ConnectivityState != connectivity.Ready {
		// Its connection is lost: a hung replica is away still, from
		// its check's start (downSince), as one whose connects fail.
		rc.hung = false
	}
	// A connection made or lost: what was slow was the last one.
	rc.slow = false
	// Idle and Connecting keep downSince: a replica away cycles
	// through them between its failed connects.
	r.armLocked()
}

// armLocked sets the timer for the moment every address will have been
// away for grace, or stops it when one is not away.
func (r *reachability) armLocked() {
	if r.closed {
		return
	}
	at, _, away := r.goneAtLocked()
	if !away {
		if r.timer != nil {
			r.timer.Stop()
		}
		return
	}
	d := at.Sub(r.now())
	if d < 0 {
		d = 0
	}
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.fire)
		return
	}
	r.timer.Reset(d)
}

func (r *reachability) fire() {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if !closed {
		r.wake()
	}
}

// goneAtLocked reports whether every address is away, and when the
// last of them (last) counts as gone: RestartGrace after it went away,
// or when it was found hung (it is not restarting).
func (r *reachability) goneAtLocked() (at time.Time, last *reach, away bool) {
	for rc := range r.conns {
		if rc.downSince.IsZero() {
			return time.Time{}, nil, false
		}
		gone := rc.downSince.Add(r.grace)
		if (rc.hung || rc.stopped) && rc.hungAt.Before(gone) {
			gone = rc.hungAt
		}
		if last == nil || gone.After(at) {
			at, last = gone, rc
		}
	}
	return at, last, last != nil
}

// unreachable returns the error that ends every call while each address
// has failed to connect for longer than grace, or nil.
func (r *reachability) unreachable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, last, away := r.goneAtLocked()
	if !away || r.now().Before(at) {
		return nil
	}
	msg := fmt.Sprintf("%s (none connected for %v", NoReplicaReachable, r.grace)
	if last.hung || last.stopped {
		msg = NoReplicaReachable + " (none answers"
	}
	if last.err != nil {
		msg += ": " + last.why()
	}
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, msg+")")
}

// why is rc's last failure in words. A connect cut at its deadline
// (gRPC closes the connection it made, so the read of the server's
// preface fails on a closed connection) reached a socket that accepted
// and a process that did not answer: a hung one, which gRPC's own
// words ("error reading server preface: ... use of closed network
// connection") do not say.
func (rc *reach) why() string {
	var stopped errPeerStopped
	if errors.As(rc.err, &stopped) {
		return stopped.Error()
	}
	if errors.Is(rc.err, net.ErrClosed) {
		return fmt.Sprintf("%s accepts connections but did not answer one within %v: %s", rc.addr, ConnectTimeout, StoppedOrHung)
	}
	return rc.err.Error()
}

// close stops the timer and the probers, and waits for the probers.
func (r *reachability) close() {
	r.mu.Lock()
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
	r.stop()
	r.wg.Wait()
}

// NewSubConn is the children's: each SubConn's connection is recorded
// (reachability) for the picker methodRRConn makes.
func (c *methodRRConn) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	opts, rc, forget := c.reach.listen(addrs, opts)
	sc, err := c.ClientConn.NewSubConn(addrs, opts)
	if err != nil {
		forget()
		return nil, err
	}
	c.reach.bind(rc, sc)
	return sc, nil
}

// unreachablePicker fails every call with err: a status error, which
// gRPC ends a waiting call with (WaitForReady or not).
func unreachablePicker(err error) balancer.Picker {
	return base.NewErrPicker(err)
}
