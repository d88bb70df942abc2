package rpcerr_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

func TestToWireTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want rpcerr.WireError
	}{
		{"session not found", rpcerr.Error(codes.NotFound, rpcerr.ReasonSessionNotFound, rpcerr.NoIndex, "Session s1 not found"),
			rpcerr.WireError{Code: -32000, Message: "Session s1 not found", Data: map[string]any{"reason": "not_found"}}},
		{"busy", rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, "busy"),
			rpcerr.WireError{Code: -32002, Message: "busy", Data: map[string]any{"reason": "conflict"}}},
		{"not owned", rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonSessionNotOwned, rpcerr.NoIndex, "not yours"),
			rpcerr.WireError{Code: -32003, Message: "not yours", Data: map[string]any{"reason": "unowned"}}},
		{"session limit", rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex, "full"),
			rpcerr.WireError{Code: -32001, Message: "full", Data: map[string]any{"reason": "capacity"}}},
		{"forbidden batch entry", rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, 2, "forbidden"),
			rpcerr.WireError{Code: -32012, Message: "forbidden", Data: map[string]any{"reason": "forbidden", "index": 2}}},
		{"invalid batch entry", rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, 3, "sets[3].value must be an integer"),
			rpcerr.WireError{Code: -32602, Message: "sets[3].value must be an integer", Data: map[string]any{"reason": "invalid", "index": 3}}},
		{"plain invalid argument", status.Error(codes.InvalidArgument, "Unknown or expired upload `x`"),
			rpcerr.WireError{Code: -32602, Message: "Unknown or expired upload `x`"}},
		{"auth", status.Error(codes.Unauthenticated, "auth_token is not paired"),
			rpcerr.WireError{Code: -32010, Message: "auth_token is not paired"}},
		{"permission", status.Error(codes.PermissionDenied, "no Config:Update"),
			rpcerr.WireError{Code: -32012, Message: "no Config:Update", Data: map[string]any{"reason": "forbidden"}}},
		{"unimplemented", status.Error(codes.Unimplemented, "method Prompt not implemented"),
			rpcerr.WireError{Code: -32601, Message: "Method not implemented by the session service yet"}},
		{"unavailable hides internals", status.Error(codes.Unavailable, "connection refused /tmp/x.sock"),
			rpcerr.WireError{Code: -32603, Message: "session unavailable"}},
		{"internal hides internals", status.Error(codes.Internal, "pq: relation does not exist"),
			rpcerr.WireError{Code: -32603, Message: "session failed"}},
		{"deadline", fmt.Errorf("call: %w", context.DeadlineExceeded),
			rpcerr.WireError{Code: -32603, Message: "session timed out"}},
		{"plain error", errors.New("boom"),
			rpcerr.WireError{Code: -32603, Message: "session failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rpcerr.ToWire("session", tc.err)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
