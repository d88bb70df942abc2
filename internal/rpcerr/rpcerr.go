// Package rpcerr carries a refusal's meaning from a service to the edge:
// services build gRPC statuses with a reason (and a batch index) attached,
// and the gateway maps them to JSON-RPC errors with one table.
package rpcerr

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain names the ErrorInfo details Clawmesh services attach.
const Domain = "clawmesh"

// Reasons a refusal can carry. The first group selects a dedicated
// JSON-RPC code; the data reasons of SPEC §4 are sent to the client in
// data.reason.
const (
	ReasonSessionNotFound = "SESSION_NOT_FOUND"
	ReasonSessionLimit    = "SESSION_LIMIT_REACHED"
	ReasonSessionBusy     = "SESSION_BUSY"
	ReasonSessionNotOwned = "SESSION_NOT_OWNED"
	ReasonAuthRequired    = "AUTH_REQUIRED"

	ReasonNotFound  = "not_found"
	ReasonUnowned   = "unowned"
	ReasonConflict  = "conflict"
	ReasonCapacity  = "capacity"
	ReasonForbidden = "forbidden"
	ReasonInvalid   = "invalid"
)

// NoIndex marks a refusal that does not point at a batch entry.
const NoIndex = -1

// Error builds a status error with a reason and, when index >= 0, the
// zero-based index of the offending batch entry.
func Error(code codes.Code, reason string, index int, msg string) error {
	st := status.New(code, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: Domain}
	if index >= 0 {
		info.Metadata = map[string]string{"index": strconv.Itoa(index)}
	}
	if withInfo, err := st.WithDetails(info); err == nil {
		st = withInfo
	}
	return st.Err()
}

// Details extracts the reason and index a status carries; index is NoIndex
// when absent.
func Details(st *status.Status) (reason string, index int) {
	index = NoIndex
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.Domain != Domain {
			continue
		}
		reason = info.Reason
		if v, ok := info.Metadata["index"]; ok {
			if n, err := strconv.Atoi(v); err == nil {
				index = n
			}
		}
	}
	return reason, index
}

// JSON-RPC codes of SPEC §4.
const (
	CodeParseError      = -32700
	CodeInvalidRequest  = -32600
	CodeMethodNotFound  = -32601
	CodeInvalidParams   = -32602
	CodeInternal        = -32603
	CodeSessionNotFound = -32000
	CodeSessionLimit    = -32001
	CodeSessionBusy     = -32002
	CodeSessionNotOwned = -32003
	CodeConnectionLimit = -32004
	CodeAuthRequired    = -32010
	CodeVersionMismatch = -32011
	CodeForbidden       = -32012
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
	ReasonSessionNotFound: CodeSessionNotFound,
	ReasonSessionLimit:    CodeSessionLimit,
	ReasonSessionBusy:     CodeSessionBusy,
	ReasonSessionNotOwned: CodeSessionNotOwned,
	ReasonAuthRequired:    CodeAuthRequired,
	ReasonForbidden:       CodeForbidden,
}

// codeTable maps the remaining gRPC codes; codes absent here are failures
// of a dependency (-32603).
var codeTable = map[codes.Code]int64{
	codes.InvalidArgument:    CodeInvalidParams,
	codes.NotFound:           CodeInvalidParams,
	codes.AlreadyExists:      CodeInvalidParams,
	codes.FailedPrecondition: CodeInvalidParams,
	codes.OutOfRange:         CodeInvalidParams,
	codes.ResourceExhausted:  CodeInvalidParams,
	codes.PermissionDenied:   CodeForbidden,
	codes.Unauthenticated:    CodeAuthRequired,
	codes.Unimplemented:      CodeMethodNotFound,
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
	reason, index := Details(st)
	code, known := reasonCodes[reason]
	if !known {
		code, known = codeTable[st.Code()]
	}
	if !known {
		msg := service + " unavailable"
		if st.Code() == codes.DeadlineExceeded {
			msg = service + " timed out"
		} else if st.Code() == codes.Internal || st.Code() == codes.Unknown {
			msg = service + " failed"
		}
		return WireError{Code: CodeInternal, Message: msg}
	}
	we := WireError{Code: code, Message: st.Message()}
	if code == CodeMethodNotFound {
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
	case ReasonNotFound, ReasonUnowned, ReasonConflict, ReasonCapacity, ReasonForbidden, ReasonInvalid:
		return reason
	case ReasonSessionNotFound:
		return ReasonNotFound
	case ReasonSessionNotOwned:
		return ReasonUnowned
	case ReasonSessionBusy:
		return ReasonConflict
	case ReasonSessionLimit:
		return ReasonCapacity
	}
	switch code {
	case codes.PermissionDenied:
		return ReasonForbidden
	}
	return ""
}
