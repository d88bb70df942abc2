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
	return &methodRRBalancer{Balancer: endpointsharding.NewBalancer(&methodRRConn{ClientConn: cc}, opts, child, endpointsharding.Options{})}
}

type methodRRBalancer struct {
	balancer.Balancer
}

func (b *methodRRBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	// As round_robin: the pick_first children report their health
	// (healthCheckConfig) only when asked to.
	return b.Balancer.UpdateClientConnState(balancer.ClientConnState{ResolverState: pickfirst.EnableHealthListener(s.ResolverState)})
}

// methodRRConn takes the state endpointsharding makes and replaces its
// picker, which takes the children in the aggregate state in turn, by
// one that does it per method.
type methodRRConn struct {
	balancer.ClientConn
}

func (c *methodRRConn) UpdateState(s balancer.State) {
	var pickers []balancer.Picker
	for _, ch := range endpointsharding.ChildStatesFromPicker(s.Picker) {
		if ch.State.ConnectivityState == s.ConnectivityState && ch.State.Picker != nil {
			pickers = append(pickers, ch.State.Picker)
		}
	}
	if len(pickers) > 0 && s.ConnectivityState != connectivity.Shutdown {
		s.Picker = &methodPicker{pickers: pickers, turns: map[string]*atomic.Uint32{}}
	}
	c.ClientConn.UpdateState(s)
}

// methodPicker picks the children's pickers in turn, one turn a method,
// each starting at random (as round_robin's) so that clients do not all
// begin with the same replica.
type methodPicker struct {
	pickers []balancer.Picker
	mu      sync.Mutex
	turns   map[string]*atomic.Uint32
	shared  atomic.Uint32 // the methods past maxMethodTurns
}

func (p *methodPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	n := p.turn(info.FullMethodName).Add(1)
	return p.pickers[n%uint32(len(p.pickers))].Pick(info)
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
