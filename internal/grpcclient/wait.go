package grpcclient

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// NoReplicaServes is the message of a call through DialReplicas whose
// deadline came while no replica served (each starting, or restarting:
// away for less than RestartGrace; NoReplicaReachable after). The
// status is Unavailable with rpcerr.ReasonDependency, which the gateway
// shows as "<service>: starting: ...", as a replica's start's server
// says it.
const NoReplicaServes = "starting: no replica serves yet"

// waitForReplica makes a call with a deadline wait for a replica that
// serves (gRPC's WaitForReady), within that deadline: with every
// replica starting, a call failed at once with Unavailable, though the
// first to serve would have answered it moments later (a restart of
// every replica, a stack's start). A call without a deadline fails at
// once as before: it would wait for ever. A call that gives its own
// WaitForReady keeps it. The wait ends early, with NoReplicaReachable,
// once every replica has failed to connect for RestartGrace (the
// balancer's picker, reach.go): a sandbox gone for good is not waited
// for to the end of a tool call's minutes.
func waitForReplica(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append([]grpc.CallOption{grpc.WaitForReady(true), grpc.Peer(&p)}, opts...)...)
	return noReplicaServes(ctx, err, p.Addr == nil)
}

// waitForReplicaStream is waitForReplica for streams: the wait is the
// stream's start.
func waitForReplicaStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if _, ok := ctx.Deadline(); !ok {
		return streamer(ctx, desc, cc, method, opts...)
	}
	s, err := streamer(ctx, desc, cc, method, append([]grpc.CallOption{grpc.WaitForReady(true)}, opts...)...)
	// A stream that failed to start never reached a replica.
	return s, noReplicaServes(ctx, err, true)
}

// noReplicaServes names err, a call's that reached no replica
// (unsent) before its deadline, for what it is: no replica served.
func noReplicaServes(ctx context.Context, err error, unsent bool) error {
	if err == nil || !unsent || !errors.Is(ctx.Err(), context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
		return err
	}
	// gRPC's message is the balancer's last error (a replica's health
	// NOT_SERVING, a refused connect): kept after the name.
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, NoReplicaServes+" ("+status.Convert(err).Message()+")")
}
