package grpcclient

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
)

// methodRoundRobin is the name of gRPC's round_robin with one turn per
// method: each method's calls go to the replicas in turn, whatever the
// calls of other methods in between. gRPC's round_robin keeps one turn
// for every call of the connection, so a caller whose calls come in a
// fixed pattern saw each kind of call pinned to one replica: the
// session's turn with one tool call is a ListTools and an ExecuteTool,
// and with two replicas every ExecuteTool went to the same one, for as
// long as the replica set did not change (a restarted replica got no
// tool call at all on half the picks of the turn; the e2e test
// TestCallsGoToTheReplicaServingWhileTheOtherStarts failed so).
const methodRoundRobin = "clawmesh_method_round_robin"

// maxMethodTurns bounds the turns a picker keeps, one a method: a
// client's methods are its code's, a few. A method past the bound
// shares one turn, as every call did with round_robin.
const maxMethodTurns = 64

func init() {
	balancer.Register(methodRRBuilder{})
}

type methodRRBuilder struct{}

func (methodRRBuilder) Name() string { return methodRoundRobin }

// Build is round_robin's (one pick_first child an address, their
// health listened to for healthCheckConfig) with the picker replaced.
func (methodRRBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	child := balancer.Get(pickfirst.Name).Build
	conn := &methodRRConn{ClientConn: cc}
	conn.reach = newReachability(RestartGrace, conn.repick)
	return &methodRRBalancer{Balancer: endpointsharding.NewBalancer(conn, opts, child, endpointsharding.Options{}), conn: conn}
}

type methodRRBalancer struct {
	balancer.Balancer
	conn *methodRRConn
}

func (b *methodRRBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	// As round_robin: the pick_first children report their health
	// (healthCheckConfig) only when asked to.
	return b.Balancer.UpdateClientConnState(balancer.ClientConnState{ResolverState: pickfirst.EnableHealthListener(s.ResolverState)})
}

// Close closes the children, then stops the reachability's timer: no
// picker is pushed after it.
func (b *methodRRBalancer) Close() {
	b.Balancer.Close()
	b.conn.close()
}

// methodRRConn takes the state endpointsharding makes and replaces its
// picker, which takes the children in the aggregate state in turn, by
// one that does it per method; or, while every address has failed to
// connect for longer than RestartGrace (reach), by one that fails each
// call NoReplicaReachable, waiting calls included.
type methodRRConn struct {
	balancer.ClientConn
	reach *reachability

	// mu orders the pickers pushed: endpointsharding's (UpdateState)
	// and the reachability timer's (repick).
	mu     sync.Mutex
	last   balancer.State // endpointsharding's last; Picker nil: none yet
	closed bool
}

func (c *methodRRConn) UpdateState(s balancer.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = s
	c.ClientConn.UpdateState(c.picked(s))
}

// repick pushes the last state again with its picker made anew: every
// address has now been away for RestartGrace.
func (c *methodRRConn) repick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.last.Picker == nil {
		return
	}
	c.ClientConn.UpdateState(c.picked(c.last))
}

func (c *methodRRConn) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.reach.close()
}

// picked is s with the picker that takes its place.
func (c *methodRRConn) picked(s balancer.State) balancer.State {
	// Ready too: a replica hung on its connection is Ready to gRPC.
	if s.ConnectivityState != connectivity.Shutdown {
		if err := c.reach.unreachable(); err != nil {
			if s.ConnectivityState == connectivity.Ready {
				s.ConnectivityState = connectivity.TransientFailure
			}
			s.Picker = unreachablePicker(err)
			return s
		}
	}
	var pickers []balancer.Picker
	for _, ch := range endpointsharding.ChildStatesFromPicker(s.Picker) {
		if ch.State.ConnectivityState == s.ConnectivityState && ch.State.Picker != nil {
			pickers = append(pickers, ch.State.Picker)
		}
	}
	if len(pickers) > 0 && s.ConnectivityState != connectivity.Shutdown {
		s.Picker = &methodPicker{pickers: pickers, reach: c.reach, turns: map[string]*atomic.Uint32{}}
	}
	return s
}

// methodPicker picks the children's pickers in turn, one turn a method,
// each starting at random (as round_robin's) so that clients do not all
// begin with the same replica.
type methodPicker struct {
	pickers []balancer.Picker
	reach   *reachability
	mu      sync.Mutex
	turns   map[string]*atomic.Uint32
	shared  atomic.Uint32 // the methods past maxMethodTurns
}

// Pick skips the replicas found hung (reachability.track): with each of
// them hung, the call waits for the picker that fails it or takes it
// to a replica back. It skips a slow one (running, answering nothing)
// too, and takes it only when every replica is hung or slow.
func (p *methodPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	n := p.turn(info.FullMethodName).Add(1)
	slow := false
	for pass := range 2 {
		for i := range uint32(len(p.pickers)) {
			res, err := p.pickers[(n+i)%uint32(len(p.pickers))].Pick(info)
			if err != nil {
				return res, err
			}
			res, v := p.reach.track(info.Ctx, res, pass == 1)
			switch v {
			case pickTaken:
				return res, nil
			case pickSlow:
				slow = true
			}
		}
		if !slow {
			break
		}
	}
	return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
}

func (p *methodPicker) turn(method string) *atomic.Uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.turns[method]
	if ok {
		return t
	}
	if len(p.turns) >= maxMethodTurns {
		return &p.shared
	}
	t = new(atomic.Uint32)
	t.Store(rand.Uint32N(uint32(len(p.pickers))))
	p.turns[method] = t
	return t
}
