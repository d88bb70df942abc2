// Package grpcclient dials Clawmesh services over Unix socket paths or TCP
// host:port addresses, one or several (replicas spread round-robin).
package grpcclient

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	// Registers the client-side health check DialReplicas's service
	// config asks for; without it gRPC ignores healthCheckConfig.
	_ "google.golang.org/grpc/health"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
)

// Keepalive of a client connection with calls in flight: after
// KeepaliveTime without a frame from the peer it is pinged, and the
// connection fails when no answer comes within KeepaliveTimeout.
// KeepaliveTime is gRPC's smallest allowed.
const (
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 5 * time.Second
)

// ConnectTimeout bounds one attempt to connect, the HTTP/2 handshake
// included: a peer whose socket accepts but that does not answer (a
// stopped or hung process) fails the attempt after it.
const ConnectTimeout = 2 * time.Second

// Dial opens a lazy client connection; it does not wait for the server, so
// services may start in any order. addr is an absolute socket path, a
// host:port, a DNS name (dns:///name:port, used by compose and Kubernetes
// to find every replica), or a comma-separated list of paths and host:ports
// over which calls are spread round-robin.
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, fmt.Errorf("dial: empty address")
	}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcserver.MaxMessageBytes), grpc.MaxCallSendMsgSize(grpcserver.MaxMessageBytes)),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		// A peer is restarted by its supervisor within moments: find it
		// again as fast (gRPC's default backoff grows to two minutes).
		// At start a dependent asks for a peer that listens a few hundred
		// milliseconds later; a delay grown past 100 ms would add most of
		// itself to the stack's start (a refused connect costs
		// microseconds, so ten a second to a peer that is down cost
		// nothing).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: ConnectTimeout,
		}),
		// A peer that hangs (stopped, deadlocked) fails the calls in
		// flight on it after KeepaliveTime+KeepaliveTimeout of silence,
		// whatever their own deadline: the process side allows these
		// pings (grpcserver's enforcement policy).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
	}
	target := addr
	if explicit(addr) {
		// Explicit addresses: a manual resolver hands them all to the
		// round-robin balancer, and the dialer picks unix or tcp per address.
		var addrs []resolver.Address
		for _, a := range strings.Split(addr, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, resolver.Address{Addr: a})
			}
		}
		r := manual.NewBuilderWithScheme("clawmesh")
		r.InitialState(resolver.State{Addresses: addrs})
		base = append(base, grpc.WithResolvers(r), grpc.WithContextDialer(dialer))
		target = "clawmesh:///" + strings.ReplaceAll(addr, ",", ";")
	}
	cc, err := grpc.NewClient(target, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return cc, nil
}

// connecting, when set, is told of each connect dialer makes: a test's
// count of the connections a replica's socket is offered.
var connecting atomic.Pointer[func(addr string)]

// explicit reports whether addr lists its addresses (Dial's dialer
// connects to them) rather than naming a resolver's target.
func explicit(addr string) bool {
	return strings.HasPrefix(addr, "/") || strings.Contains(addr, ",")
}

func dialer(ctx context.Context, addr string) (net.Conn, error) {
	if f := connecting.Load(); f != nil {
		(*f)(addr)
	}
	var d net.Dialer
	if strings.HasPrefix(addr, "/") {
		return d.DialContext(ctx, "unix", addr)
	}
	return d.DialContext(ctx, "tcp", addr)
}

// replicasServiceConfig is Dial's round-robin, taken per method
// (methodRoundRobin), with gRPC's client-side health checking of
// grpcserver.Calls: a replica is picked only while it says it answers
// its calls.
var replicasServiceConfig = fmt.Sprintf(`{"loadBalancingConfig":[{%q:{}}],"healthCheckConfig":{"serviceName":%q}}`, methodRoundRobin, grpcserver.Calls)

// DialReplicas is Dial for a service's own calls to the replicas of one
// service (the plugin sandbox's, one or several, --scale), each
// method's calls taken round-robin by themselves (methodRoundRobin): a
// call goes only to a replica that serves, never to one still
// starting, which answers on its socket already (grpcserver's start's
// server) and failed every call it got with Unavailable while another
// replica served. A replica that stops (its health NOT_SERVING at
// shutdown) is left too. When none serves, a call with a deadline waits
// for one within it, and fails then with Unavailable NoReplicaServes
// (waitForReplica); one without waits for one as long
// as RestartGrace. Once every replica has failed to
// connect for RestartGrace (each gone: not restarted, or not there at
// all; or hung, its connects timing out after ConnectTimeout, counted
// from their start), calls fail at once, the waiting ones included,
// with Unavailable NoReplicaReachable. A replica connected but stopped
// or hung, found so by a health check on its connection while calls
// wait there (answer.go), ends those calls, is not picked, and counts
// as gone at once until a check answers. One address is dialled the same
// way: a call while the only replica starts or restarts waits for it as
// for one of several. Health calls must not use it: they would be
// routed to the replicas that serve only.
func DialReplicas(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	w := newStopWait()
	// A later default service config replaces Dial's.
	own := []grpc.DialOption{
		// Insecure as Dial's, knowing each Unix socket's process
		// (peer.go).
		grpc.WithTransportCredentials(newPeerCreds(w)),
		grpc.WithDefaultServiceConfig(replicasServiceConfig),
		grpc.WithChainUnaryInterceptor(waitForReplica),
		grpc.WithChainStreamInterceptor(waitForReplicaStream),
	}
	if explicit(addr) {
		// Dial's dialer, not connecting to a stopped process's socket
		// (stops.go).
		own = append(own, grpc.WithContextDialer(w.dial))
	}
	return Dial(addr, append(own, opts...)...)
}
