package durablebridge

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	durablev1 "github.com/clawmesh/clawmesh/proto/clawmesh/durable/v1"
)

// GRPC is the bridge's gRPC surface, for operators and tests: it shows
// what Collie reads over the private socket.
type GRPC struct {
	durablev1.UnimplementedDurableServiceServer
	b *Bridge
}

// NewGRPC serves b's state over gRPC.
func NewGRPC(b *Bridge) *GRPC { return &GRPC{b: b} }

// State reports the epoch, revision, readiness and endpoints.
func (g *GRPC) State(context.Context, *durablev1.StateRequest) (*durablev1.StateResponse, error) {
	l := g.b.layout
	return &durablev1.StateResponse{
		Epoch: l.Epoch(), Revision: l.Rev(), SocketPath: g.b.SocketPath(), Panes: int32(l.PaneCount()),
		Ready: l.Ready(), ListenAddress: g.b.ListenAddr(),
	}, nil
}

// Snapshot returns the snapshot as the socket serves it.
func (g *GRPC) Snapshot(context.Context, *durablev1.SnapshotRequest) (*durablev1.SnapshotResponse, error) {
	tag, body := g.b.layout.Snapshot(overSocket)
	return &durablev1.SnapshotResponse{Etag: tag, Json: string(body)}, nil
}

// PaneEvents returns a pane's events after a cursor of this epoch.
func (g *GRPC) PaneEvents(_ context.Context, req *durablev1.PaneEventsRequest) (*durablev1.PaneEventsResponse, error) {
	if !validID(req.GetPaneId()) {
		return nil, status.Error(codes.InvalidArgument, "`pane_id` is not an id")
	}
	l := g.b.layout
	body, ok := l.paneEvents(req.GetPaneId(), l.Epoch(), req.GetAfter(), req.After != nil, overSocket)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no pane %s", req.GetPaneId())
	}
	return &durablev1.PaneEventsResponse{Json: string(body)}, nil
}
