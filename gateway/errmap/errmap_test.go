package errmap_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

func TestToWireTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want errmap.WireError
	}{
		{"session not found", rpcerr.Error(codes.NotFound, rpcerr.ReasonSessionNotFound, rpcerr.NoIndex, "Session s1 not found"),
			errmap.WireError{Code: -32000, Message: "Session s1 not found", Data: map[string]any{"reason": "not_found"}}},
		{"busy", rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, "busy"),
			errmap.WireError{Code: -32002, Message: "busy", Data: map[string]any{"reason": "conflict"}}},
		{"not owned", rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, rpcerr.NoIndex, "not yours"),
			errmap.WireError{Code: -32003, Message: "not yours", Data: map[string]any{"reason": "unowned"}}},
		{"session limit", rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex, "full"),
			errmap.WireError{Code: -32001, Message: "full", Data: map[string]any{"reason": "capacity"}}},
		{"forbidden batch entry", rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, 2, "forbidden"),
			errmap.WireError{Code: -32012, Message: "forbidden", Data: map[string]any{"reason": "forbidden", "index": 2}}},
		{"invalid batch entry", rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, 3, "sets[3].value must be an integer"),
			errmap.WireError{Code: -32602, Message: "sets[3].value must be an integer", Data: map[string]any{"reason": "invalid", "index": 3}}},
		{"plain invalid argument", status.Error(codes.InvalidArgument, "Unknown or expired upload `x`"),
			errmap.WireError{Code: -32602, Message: "Unknown or expired upload `x`"}},
		{"auth", status.Error(codes.Unauthenticated, "auth_token is not paired"),
			errmap.WireError{Code: -32010, Message: "auth_token is not paired"}},
		{"permission", status.Error(codes.PermissionDenied, "no Config:Update"),
			errmap.WireError{Code: -32012, Message: "no Config:Update", Data: map[string]any{"reason": "forbidden"}}},
		{"unimplemented", status.Error(codes.Unimplemented, "method Prompt not implemented"),
			errmap.WireError{Code: -32601, Message: "Method not implemented by the session service yet"}},
		{"unavailable hides internals", status.Error(codes.Unavailable, "connection refused /tmp/x.sock"),
			errmap.WireError{Code: -32603, Message: "session unavailable"}},
		{"a dependency named", rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "database unavailable"),
			errmap.WireError{Code: -32603, Message: "session: database unavailable"}},
		{"internal hides internals", status.Error(codes.Internal, "pq: relation does not exist"),
			errmap.WireError{Code: -32603, Message: "session failed"}},
		{"deadline", fmt.Errorf("call: %w", context.DeadlineExceeded),
			errmap.WireError{Code: -32603, Message: "session timed out"}},
		{"capacity refusal", rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonCapacity, rpcerr.NoIndex, "the plugin sandbox is running its maximum number of instances; retry later"),
			errmap.WireError{Code: -32602, Message: "the plugin sandbox is running its maximum number of instances; retry later", Data: map[string]any{"reason": "capacity"}}},
		{"a reply past grpc's size bound", status.Error(codes.ResourceExhausted, "trying to send message larger than max (18874522 vs. 16777216)"),
			errmap.WireError{Code: -32603, Message: "session failed"}},
		{"plain error", errors.New("boom"),
			errmap.WireError{Code: -32603, Message: "session failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := errmap.ToWire("session", tc.err)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
