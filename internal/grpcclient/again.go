package grpcclient

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ReadAgain is call, a read through a DialReplicas client of replicas
// addresses, made again while it fails Unavailable on its own, not for
// want of a replica (that wait is done: NoReplicaReachable,
// NoReplicaServes): picked on the connection of a replica killed a
// moment before, which the client had not yet seen close, or ended
// because its replica is stopped or hung (NotAnswering); either replica
// is no longer picked once the client has seen it, and another may
// answer. Tried once more only, a read with every replica killed at
// once failed Unavailable with the dead connection's words where it
// should say that no replica is reachable: the second try, like the
// first, was picked on a replica whose end the client had not yet seen
// (the gateway's plugins/list, then the session's tool listing, whose
// turn was told "it is unavailable"). So up to twice a replica and once
// more, after which the picker knows every one of them; with every
// replica hung each try fails at once. For reads only: a read changes
// nothing, so the tries are harmless.
func ReadAgain[T any](ctx context.Context, replicas int, call func() (T, error)) (T, error) {
	v, err := call()
	for range 2 * max(replicas, 1) {
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil || Unreachable(err) || Unserved(err) {
			break
		}
		v, err = call()
	}
	return v, err
}

// Addrs counts the addresses of addr as Dial reads it: a list split at
// commas, one for anything else (a DNS name's replicas are not known
// until it resolves).
func Addrs(addr string) int {
	n := 0
	for _, a := range strings.Split(addr, ",") {
		if strings.TrimSpace(a) != "" {
			n++
		}
	}
	return max(n, 1)
}
