package grpcclient

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
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
// every replica, a stack's start). A call that gives its own
// WaitForReady keeps it. The wait ends early, with NoReplicaReachable,
// once every replica has failed to connect for RestartGrace (the
// balancer's picker, reach.go): a sandbox gone for good is not waited
// for to the end of a tool call's minutes. A call without a deadline
// waits as one whose deadline is RestartGrace away would, and runs
// unbounded once it has reached a replica (withoutDeadline).
//
// The call is ended, Unavailable naming its replica, when that replica
// leaves a health check on the call's connection unanswered (answer.go):
// it is stopped or hung.
func waitForReplica(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	callCtx, done := watched(ctx)
	defer done(nil)
	if _, ok := ctx.Deadline(); !ok {
		return ended(ctx, callCtx, withoutDeadline(callCtx, cc, func() (bool, error) {
			var p peer.Peer
			err := invoker(callCtx, method, req, reply, cc, append([]grpc.CallOption{grpc.Peer(&p)}, opts...)...)
			return p.Addr == nil, err
		}))
	}
	var p peer.Peer
	err := invoker(callCtx, method, req, reply, cc, append([]grpc.CallOption{grpc.WaitForReady(true), grpc.Peer(&p)}, opts...)...)
	return ended(ctx, callCtx, noReplicaServes(ctx, err, p.Addr == nil))
}

// waitForReplicaStream is waitForReplica for streams: the wait is the
// stream's start.
func waitForReplicaStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if _, ok := ctx.Deadline(); !ok {
		var s grpc.ClientStream
		err := withoutDeadline(ctx, cc, func() (bool, error) {
			var err error
			s, err = streamer(ctx, desc, cc, method, opts...)
			// A stream that failed to start never reached a replica.
			return true, err
		})
		return s, err
	}
	s, err := streamer(ctx, desc, cc, method, append([]grpc.CallOption{grpc.WaitForReady(true)}, opts...)...)
	return s, noReplicaServes(ctx, err, true)
}

// withoutDeadline runs call, a call without a deadline and without
// WaitForReady, which fails at once while no replica serves (every one
// restarting, or starting): again each time the client's state changes,
// for RestartGrace, while it fails Unavailable without having reached a
// replica. It used to fail at once, so that a restart of the only
// sandbox failed such a call where one with a deadline was answered.
// It cannot simply wait for ready: with nothing to end the wait, a
// replica that connects and never serves would hold it for ever; and
// the call itself cannot be given a deadline, which would bound its
// run as well as its wait. After the wait its error is
// NoReplicaServes, as a deadline's would be, or NoReplicaReachable,
// which ends the wait at once.
func withoutDeadline(ctx context.Context, cc *grpc.ClientConn, call func() (unsent bool, err error)) error {
	wait, cancel := context.WithTimeout(ctx, RestartGrace)
	defer cancel()
	for {
		before := cc.GetState()
		unsent, err := call()
		if err == nil || !unsent || status.Code(err) != codes.Unavailable || Unreachable(err) {
			return err
		}
		if wait.Err() != nil {
			if ctx.Err() != nil {
				return err
			}
			return notServed(err)
		}
		// Failed while a replica served: the next try waits for a
		// change, not at once in a loop.
		if st := cc.GetState(); st == connectivity.Ready && before == connectivity.Ready {
			cc.WaitForStateChange(wait, st)
		}
		for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
			if st == connectivity.Idle {
				cc.Connect()
			}
			if !cc.WaitForStateChange(wait, st) {
				break
			}
		}
	}
}

// Unreachable reports whether err is a call's that failed because every
// replica has been away for RestartGrace (NoReplicaReachable): one that
// waiting will not mend.
func Unreachable(err error) bool {
	return strings.HasPrefix(status.Convert(err).Message(), NoReplicaReachable)
}

// Unserved reports whether err is a call's that found no replica serving
// within its wait (NoReplicaServes): every one starting or restarting.
func Unserved(err error) bool {
	return strings.HasPrefix(status.Convert(err).Message(), NoReplicaServes)
}

// noReplicaServes names err, a call's that reached no replica
// (unsent) before its deadline, for what it is: no replica served.
func noReplicaServes(ctx context.Context, err error, unsent bool) error {
	if err == nil || !unsent || !errors.Is(ctx.Err(), context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
		return err
	}
	return notServed(err)
}

// notServed is err, a call's that found no replica serving, as
// NoReplicaServes. gRPC's message is the balancer's last error (a
// replica's health NOT_SERVING, a refused connect): kept after the
// name.
func notServed(err error) error {
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, NoReplicaServes+" ("+status.Convert(err).Message()+")")
}
