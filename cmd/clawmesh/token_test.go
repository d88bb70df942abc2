package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// noUsers is a config service that knows no user.
type noUsers struct {
	configv1.UnimplementedConfigServiceServer
}

func (noUsers) CreateToken(_ context.Context, r *configv1.CreateTokenRequest) (*configv1.CreateTokenResponse, error) {
	return nil, status.Errorf(codes.NotFound, "user %q does not exist; set users.%s.permission_profiles first", r.GetUser(), r.GetUser())
}

// token's failures read as the rest of the CLI's do: the service's
// words, not gRPC's "rpc error: code = NotFound desc = ...", and a stack
// that is not running is named as such, with what to do, where it printed
// only "rpc error: code = Unavailable desc = connection error: ...".
func TestTokenErrorsSayWhatToDo(t *testing.T) {
	dir, err := os.MkdirTemp("", "cm-t-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	var out strings.Builder
	err = tokenCmd([]string{"create", "--user", "me", "--config-dir", dir}, &out)
	if err == nil || !strings.Contains(err.Error(), "is the stack running") || !strings.Contains(err.Error(), "clawmesh up") ||
		strings.Contains(err.Error(), "rpc error") {
		t.Fatalf("token create with no stack: %v", err)
	}

	path := filepath.Join(dir, "config.sock")
	srv := grpcserver.New(testenv.Logger(t), 0)
	configv1.RegisterConfigServiceServer(srv.GRPC, noUsers{})
	lis, err := grpcserver.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	err = tokenCmd([]string{"create", "--user", "me", "--config-dir", dir}, &out)
	if err == nil || err.Error() != `token create: user "me" does not exist; set users.me.permission_profiles first` {
		t.Fatalf("token create of no user: %v", err)
	}
	err = tokenCmd([]string{"revoke", "--user", "me", "--config-addr", path}, &out)
	if err == nil || strings.Contains(err.Error(), "rpc error") || !strings.Contains(err.Error(), "token revoke: ") {
		t.Fatalf("token revoke, unimplemented: %v", err)
	}
}
