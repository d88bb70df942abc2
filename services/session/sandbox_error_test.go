package session

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// A memory or skill call that could not reach the sandbox (its
// connection lost to a hung one, by the keepalive; no replica
// reachable) failed with the transport's words alone, "keepalive ping
// failed to receive ACK within timeout" or "no replica is reachable
// (...)", where a plugin tool's call says "plugin sandbox unavailable".
// It names the sandbox now; what the sandbox itself answers is kept
// as it said it.
func TestASandboxOutOfReachIsNamed(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unavailable, "keepalive ping failed to receive ACK within timeout"),
			"plugin sandbox unavailable: keepalive ping failed to receive ACK within timeout"},
		{rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, grpcclient.NoReplicaReachable+" (x)"),
			"plugin sandbox unavailable: " + grpcclient.NoReplicaReachable + " (x)"},
		{rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, "plugin sandbox unavailable"), "plugin sandbox unavailable"},
		{rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, "plugin config unavailable"), "plugin config unavailable"},
		{rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, "no memory plugin \"x\""), "no memory plugin \"x\""},
		{errors.New("arguments: bad"), "arguments: bad"},
	} {
		if got := sandboxError(c.err).Error(); got != c.want {
			t.Errorf("sandboxError(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
