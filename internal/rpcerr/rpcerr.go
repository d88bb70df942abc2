// Package rpcerr carries a refusal's meaning from a service to the edge:
// services return gRPC statuses with a reason (and a batch index)
// attached; the gateway maps them to JSON-RPC errors with its one table
// (gateway/errmap). Services know nothing of JSON-RPC codes.
package rpcerr

import (
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain names the ErrorInfo details Clawmesh services attach.
const Domain = "clawmesh"

// Reasons a refusal can carry. The first group selects a dedicated
// client error code; the data reasons of docs/spec.md §4 are sent to the
// client in data.reason. ReasonDependency marks an Unavailable status
// whose message names the dependency that is down ("database
// unavailable"), safe to show a client.
const (
	ReasonDependency = "DEPENDENCY_UNAVAILABLE"

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
