package session

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// revokedOf refuses standing to the principals it names, and fails
// outright for "user:down" (the config service unreachable).
type revokedOf map[string]bool

func (r revokedOf) Authorize(_ context.Context, p *commonv1.Principal, permission, _ string) error {
	if permission != configschema.PermStanding {
		return status.Error(codes.Internal, "asked "+permission)
	}
	if p.GetPrincipalId() == "user:down" {
		return status.Error(codes.Unavailable, "connection refused")
	}
	if r[p.GetPrincipalId()] {
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, `the token of user "alice" was revoked`)
	}
	return nil
}

// Every method refuses a principal whose binding was revoked, before its
// handler runs; the operator and a connection's end (no principal) are
// never asked about, and nothing is asked before the live config is set.
func TestStandingRefusesARevokedPrincipal(t *testing.T) {
	var refused []any
	s := Standing{Refused: func(req any) { refused = append(refused, req) }}
	ran := 0
	handler := func(context.Context, any) (any, error) { ran++; return "ok", nil }
	call := func(method string, req any) error {
		_, err := s.Unary(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method}, handler)
		return err
	}
	messages := sessionv1.SessionService_Messages_FullMethodName
	if err := call(messages, &sessionv1.MessagesRequest{Principal: alice}); err != nil || ran != 1 {
		t.Fatalf("before the config is set: %v", err)
	}
	s.Set(revokedOf{"user:alice": true})
	err := call(messages, &sessionv1.MessagesRequest{Principal: alice})
	if status.Code(err) != codes.PermissionDenied || ran != 1 || len(refused) != 1 {
		t.Fatalf("alice revoked: %v (handler ran %d times, %d refusals released)", err, ran, len(refused))
	}
	for _, c := range []struct {
		method string
		req    any
	}{
		{messages, &sessionv1.MessagesRequest{Principal: bob}},
		{messages, &sessionv1.MessagesRequest{Principal: operator}},
		{sessionv1.SessionService_ConnectionClosed_FullMethodName, &sessionv1.ConnectionClosedRequest{ConnectionId: "c-1"}},
	} {
		if err := call(c.method, c.req); err != nil {
			t.Fatalf("%s: %v", c.method, err)
		}
	}
	if len(refused) != 1 {
		t.Fatalf("%d refusals released; one was refused", len(refused))
	}
	err = call(messages, &sessionv1.MessagesRequest{Principal: &commonv1.Principal{PrincipalId: "user:down", User: "down"}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("config service down: %v", err)
	}
}
