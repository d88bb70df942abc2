package grpcclient

import (
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
// (ConnectTimeout), so calls fail RestartGrace after that start; the
// calls already on its connection end with the connection, by the
// keepalive (KeepaliveTime + KeepaliveTimeout).
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
	trying    time.Time // the start of the attempt under way, or of the last
	downSince time.Time
	err       error
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

	mu     sync.Mutex
	conns  map[*reach]struct{} // one a SubConn, removed at its Shutdown
	timer  *time.Timer
	closed bool
}

func newReachability(grace time.Duration, wake func()) *reachability {
	return &reachability{grace: grace, now: time.Now, wake: wake, conns: map[*reach]struct{}{}}
}

// listen returns opts with a state listener that records the SubConn's
// connection before handing its state to the listener opts had, and
// the record's removal, for a SubConn that could not be made.
func (r *reachability) listen(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.NewSubConnOptions, func()) {
	rc := &reach{}
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
	return opts, func() { r.update(rc, balancer.SubConnState{ConnectivityState: connectivity.Shutdown}) }
}

func (r *reachability) update(rc *reach, s balancer.SubConnState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s.ConnectivityState {
	case connectivity.Ready:
		rc.downSince, rc.err = time.Time{}, nil
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
	case connectivity.Shutdown:
		delete(r.conns, rc)
	}
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
	at, away := r.allAwaySinceLocked()
	if !away {
		if r.timer != nil {
			r.timer.Stop()
		}
		return
	}
	d := at.Add(r.grace).Sub(r.now())
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

// allAwaySinceLocked reports whether every address is away, and since
// when the last of them is.
func (r *reachability) allAwaySinceLocked() (time.Time, bool) {
	var last time.Time
	for rc := range r.conns {
		if rc.downSince.IsZero() {
			return time.Time{}, false
		}
		if rc.downSince.After(last) {
			last = rc.downSince
		}
	}
	return last, len(r.conns) > 0
}

// unreachable returns the error that ends every call while each address
// has failed to connect for longer than grace, or nil.
func (r *reachability) unreachable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	since, away := r.allAwaySinceLocked()
	if !away || r.now().Sub(since) < r.grace {
		return nil
	}
	var last *reach
	for rc := range r.conns {
		if rc.err != nil && rc.downSince.Equal(since) {
			last = rc
		}
	}
	msg := fmt.Sprintf("%s (none connected for %v", NoReplicaReachable, r.grace)
	if last != nil {
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
	if errors.Is(rc.err, net.ErrClosed) {
		return fmt.Sprintf("%s accepts connections but did not answer one within %v: the process is stopped or hung", rc.addr, ConnectTimeout)
	}
	return rc.err.Error()
}

func (r *reachability) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
}

// NewSubConn is the children's: each SubConn's connection is recorded
// (reachability) for the picker methodRRConn makes.
func (c *methodRRConn) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	opts, forget := c.reach.listen(addrs, opts)
	sc, err := c.ClientConn.NewSubConn(addrs, opts)
	if err != nil {
		forget()
		return nil, err
	}
	return sc, nil
}

// unreachablePicker fails every call with err: a status error, which
// gRPC ends a waiting call with (WaitForReady or not).
func unreachablePicker(err error) balancer.Picker {
	return base.NewErrPicker(err)
}
