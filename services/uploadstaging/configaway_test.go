package uploadstaging

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configclient"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// awayAuthz allows until down is set, then cannot ask the config
// service, as configclient.Authorize says of one down or hung.
type awayAuthz struct{ down atomic.Bool }

func (a *awayAuthz) Authorize(context.Context, *commonv1.Principal, string, string) error {
	if a.down.Load() {
		return fmt.Errorf("%w: %w", configclient.ErrConfigUnavailable, status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
	}
	return nil
}

// A user's chunk that the config service could not authorize reached
// the client as "upload-staging unavailable", naming a service that was
// up; it now names config, as the session service's refusals do.
func TestChunkNamesConfigAway(t *testing.T) {
	authz := &awayAuthz{}
	s, _ := newServer(t, authz)
	id := begin(t, s, user, 1, "")
	authz.down.Store(true)
	_, err := chunk(s, user, id, 0, "x")
	we := errmap.ToWire("upload-staging", err)
	want := "upload-staging: config service unavailable (authorizing files:create)"
	if we.Code != jsonrpc.CodeInternal || we.Message != want || status.Code(err) != codes.Unavailable {
		t.Fatalf("chunk with config away: %d %q (%v), want %d %q", we.Code, we.Message, err, jsonrpc.CodeInternal, want)
	}
}
