// Package errmap is the edge's one table from a service's gRPC status
// (with the reason and index internal/rpcerr attaches) to the JSON-RPC
// error the client sees. Refusals keep their meaning and message; a
// failing dependency is named, never described from the inside.
package errmap

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// WireError is what the edge sends for a failed call.
type WireError struct {
	Code    int64
	Message string
	// Data is nil or {"reason":..., "index"?:N}.
	Data map[string]any
}

// reasonCodes are the reasons that select a dedicated JSON-RPC code.
var reasonCodes = map[string]int64{
	rpcerr.ReasonSessionNotFound: jsonrpc.CodeSessionNotFound,
	rpcerr.ReasonSessionLimit:    jsonrpc.CodeSessionLimit,
	rpcerr.ReasonSessionBusy:     jsonrpc.CodeSessionBusy,
	rpcerr.ReasonSessionNotOwned: jsonrpc.CodeSessionNotOwned,
	rpcerr.ReasonAuthRequired:    jsonrpc.CodeAuthRequired,
	rpcerr.ReasonForbidden:       jsonrpc.CodeForbidden,
}

// codeTable maps the remaining gRPC codes; codes absent here are failures
// of a dependency (-32603).
var codeTable = map[codes.Code]int64{
	codes.InvalidArgument:    jsonrpc.CodeInvalidParams,
	codes.NotFound:           jsonrpc.CodeInvalidParams,
	codes.AlreadyExists:      jsonrpc.CodeInvalidParams,
	codes.FailedPrecondition: jsonrpc.CodeInvalidParams,
	codes.OutOfRange:         jsonrpc.CodeInvalidParams,
	codes.ResourceExhausted:  jsonrpc.CodeInvalidParams,
	codes.PermissionDenied:   jsonrpc.CodeForbidden,
	codes.Unauthenticated:    jsonrpc.CodeAuthRequired,
	codes.Unimplemented:      jsonrpc.CodeMethodNotFound,
}

// ToWire maps an error returned by a call to service to the JSON-RPC error
// the client sees. Messages of refusals are passed through (services write
// them for clients); failures of a dependency name only the service, never
// its internal message.
func ToWire(service string, err error) WireError {
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			st = status.FromContextError(err)
		} else {
			st = status.New(codes.Unknown, err.Error())
		}
	}
	reason, index := rpcerr.Details(st)
	code, known := reasonCodes[reason]
	if !known {
		code, known = codeTable[st.Code()]
	}
	// A service refuses for capacity with a reason (rpcerr.ReasonCapacity);
	// without one, ResourceExhausted is grpc's own: a message past the
	// size bound between the processes, a failure to name, not a refusal
	// to pass on (its text describes the inside).
	tooLarge := st.Code() == codes.ResourceExhausted && reason == ""
	if tooLarge {
		known = false
	}
	if !known && reason == rpcerr.ReasonDependency {
		return WireError{Code: jsonrpc.CodeInternal, Message: service + ": " + st.Message()}
	}
	if !known {
		msg := service + " unavailable"
		if st.Code() == codes.DeadlineExceeded {
			msg = service + " timed out"
		} else if st.Code() == codes.Internal || st.Code() == codes.Unknown || tooLarge {
			msg = service + " failed"
		}
		return WireError{Code: jsonrpc.CodeInternal, Message: msg}
	}
	we := WireError{Code: code, Message: st.Message()}
	if code == jsonrpc.CodeMethodNotFound {
		we.Message = "Method not implemented by the " + service + " service yet"
	}
	if dataReason := dataReasonFor(reason, st.Code()); dataReason != "" {
		we.Data = map[string]any{"reason": dataReason}
		if index >= 0 {
			we.Data["index"] = index
		}
	} else if index >= 0 {
		we.Data = map[string]any{"index": index}
	}
	return we
}

func dataReasonFor(reason string, code codes.Code) string {
	switch reason {
	case rpcerr.ReasonNotFound, rpcerr.ReasonUnowned, rpcerr.ReasonConflict, rpcerr.ReasonCapacity, rpcerr.ReasonForbidden, rpcerr.ReasonInvalid:
		return reason
	case rpcerr.ReasonSessionNotFound:
		return rpcerr.ReasonNotFound
	case rpcerr.ReasonSessionNotOwned:
		return rpcerr.ReasonUnowned
	case rpcerr.ReasonSessionBusy:
		return rpcerr.ReasonConflict
	case rpcerr.ReasonSessionLimit:
		return rpcerr.ReasonCapacity
	}
	switch code {
	case codes.PermissionDenied:
		return rpcerr.ReasonForbidden
	}
	return ""
}
