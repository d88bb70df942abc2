package session

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/services/session/provider"
)

// Causes a turn's context is cancelled with; context.Cause tells them apart
// in logs. Every one of them ends the turn with outcome cancelled.
var (
	// ErrCancelRequested: session/cancel.
	ErrCancelRequested = errors.New("turn cancelled by session/cancel")
	// ErrConnectionClosed: the prompting connection closed or stalled.
	ErrConnectionClosed = errors.New("prompting connection closed")
	// ErrCallerGone: the Prompt RPC's own context ended.
	ErrCallerGone = errors.New("prompt call ended")
	// ErrSessionEnded: the session was closed, killed or deleted.
	ErrSessionEnded = errors.New("session closed")
	// ErrShutdown: the service is stopping.
	ErrShutdown = errors.New("session service shutting down")
)

// Errors of the agent loop; a turn that meets one ends as failed with the
// error's text as its message.
var (
	// ErrProvider wraps a provider's failure (HTTP status, bad stream,
	// timeout, a scripted /fail).
	ErrProvider = provider.ErrProvider
	// ErrUnknownProvider: agents.<alias>.provider names no provider.
	ErrUnknownProvider = errors.New("unknown provider")
	// ErrUnknownAgent: the alias is not in the config document.
	ErrUnknownAgent = errors.New("unknown agent")
	// ErrTooManySteps: the provider kept asking for tools past the limit.
	ErrTooManySteps = errors.New("too many tool rounds")
)

// Why an approval's decision was not stored though its write went
// through: the UPDATE matched no pending row of the session.
var (
	// errApprovalMissing: the approval has no row (its request's insert
	// failed); nothing holds the decision.
	errApprovalMissing = errors.New("the approval request has no stored row")
	// errApprovalSettled: the row is no longer pending (another writer
	// settled it); the stored outcome stands.
	errApprovalSettled = errors.New("the approval is no longer pending in the store")
)

// Refusals, as gRPC statuses the edge maps with internal/rpcerr.

func errSessionNotFound(id string) error {
	return rpcerr.Error(codes.NotFound, rpcerr.ReasonSessionNotFound, rpcerr.NoIndex, fmt.Sprintf("Session %s not found", id))
}

func errSessionNotOwned(id string) error {
	return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, rpcerr.NoIndex, fmt.Sprintf("Session %s belongs to another principal", id))
}

func errSessionLimit() error {
	return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex,
		fmt.Sprintf("%d sessions are open for this principal, the limit; close or delete one first", MaxOpenSessions))
}

func errChannelSessionLimit() error {
	return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex,
		fmt.Sprintf("%d channel conversations are open, the limit; lower channels.plugin.<alias>.max_sessions or close some", MaxOpenChannelSessions))
}

func errKeptSessionLimit() error {
	return rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex,
		fmt.Sprintf("%d sessions are kept for this principal, open or closed, the limit; delete one first", MaxKeptSessions))
}

func errSessionBusy(id string) error {
	return rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, fmt.Sprintf("Session %s is running a turn", id))
}

// errSurfaceAllBusy: max_open_of_surface sessions of surface are open
// and each runs a turn; one more opens once one of them ends.
func errSurfaceAllBusy(surface string) error {
	return rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex,
		fmt.Sprintf("Every open session of %s is running a turn, at its bound; try again once one ends", surface))
}

func errSessionEnded(id, state string) error {
	msg := fmt.Sprintf("Session %s is closed; resume it with session/new and its session_id", id)
	if state == stateKilled {
		msg = fmt.Sprintf("Session %s was killed and cannot be used again", id)
	}
	return rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonConflict, rpcerr.NoIndex, msg)
}

func errOtherSurface(id, surface string) error {
	return rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonConflict, rpcerr.NoIndex,
		fmt.Sprintf("Session %s belongs to the interaction surface `%s`; resume it there", id, surface))
}

func errInvalid(msg string) error {
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, msg)
}

func errUnknownApproval(id string) error {
	return rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, fmt.Sprintf("Unknown approval request `%s`", id))
}

// errDecisionNotStored is Approve's answer when the decision that won
// could not be stored (cause, the store's error): the turn did not act on
// it and cancelled the call (see ask). It names the dependency, as
// internal/service's classification does for a request's own statement,
// and not the database's text: the edge shows it as -32603 "session: ...".
func errDecisionNotStored(requestID string, cause error) error {
	why := "the database refused the write"
	switch {
	case errors.Is(cause, errApprovalMissing):
		why = "the approval request itself was not stored"
	case pg.IsUnavailable(cause):
		why = pg.ErrUnavailable.Error()
	case pg.IsDiskFull(cause):
		why = "database: no space left on its disk"
	case pg.IsBusy(cause):
		why = pg.ErrBusy.Error()
	case errors.Is(cause, context.DeadlineExceeded):
		why = "the database did not answer within the unwind bound"
	}
	return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex,
		fmt.Sprintf("the decision on approval request `%s` could not be recorded (%s); its tool call was cancelled", requestID, why))
}

// errDecisionPending is Approve's answer when its caller's context ended
// (cause) while the decision that won was being stored: the write goes on
// under the turn's own bound, so the decision, this caller's or another
// surface's, may yet stand or not. Sent again, the same decision is
// answered with the one that stands, and acts on nothing twice.
func errDecisionPending(requestID string, cause error) error {
	return rpcerr.Error(status.FromContextError(cause).Code(), rpcerr.ReasonDependency, rpcerr.NoIndex,
		fmt.Sprintf("approval request `%s`: the call ended before its decision was stored, and it may still be recorded; send the decision again to learn which one stands", requestID))
}
