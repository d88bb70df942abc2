package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// A config service that does not answer (stopped with SIGSTOP, or hung:
// the kernel still accepts its connections) held `clawmesh token` for
// its whole 30 s deadline, then printed only "rpc error: code =
// DeadlineExceeded desc = context deadline exceeded". The command asks
// the service's health first, briefly, and says it does not answer, and
// what to do.
func TestTokenSaysConfigDoesNotAnswer(t *testing.T) {
	dir, err := os.MkdirTemp("", "cm-t-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "config.sock")
	// Listening, never accepting: what a stopped process's socket does.
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	for _, cmd := range []string{"create", "revoke"} {
		var out strings.Builder
		err = tokenCmd([]string{cmd, "--user", "me", "--config-addr", path}, &out)
		if err == nil || strings.Contains(err.Error(), "rpc error") || !strings.Contains(err.Error(), "does not answer") ||
			!strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "clawmesh doctor") {
			t.Fatalf("token %s with config hung: %v", cmd, err)
		}
	}
}

// stalled is a config service whose token calls wait on a database that
// does not answer.
type stalled struct {
	configv1.UnimplementedConfigServiceServer
}

func (stalled) CreateToken(ctx context.Context, _ *configv1.CreateTokenRequest) (*configv1.CreateTokenResponse, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// A config service that answers its health but whose call runs out of
// time (its database stalled) printed only "context deadline exceeded":
// the command says which service did not answer, and that the outcome
// is unknown.
func TestTokenSaysTheCallRanOutOfTime(t *testing.T) {
	dir, err := os.MkdirTemp("", "cm-t-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "config.sock")
	srv := grpcserver.New(testenv.Logger(t), 0)
	configv1.RegisterConfigServiceServer(srv.GRPC, stalled{})
	srv.SetServing()
	lis, err := grpcserver.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	defer func(d time.Duration) { tokenCallWait = d }(tokenCallWait)
	tokenCallWait = 100 * time.Millisecond

	var out strings.Builder
	err = tokenCmd([]string{"create", "--user", "me", "--config-addr", path}, &out)
	if err == nil || !strings.Contains(err.Error(), "does not answer within 100ms") || !strings.Contains(err.Error(), "whether the token was created is unknown") ||
		!strings.Contains(err.Error(), "clawmesh doctor") || strings.Contains(err.Error(), "rpc error") {
		t.Fatalf("token create with the database stalled: %v", err)
	}
}
