package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

const tokenUsage = `usage: clawmesh token <create|revoke> --user NAME [--config-dir DIR] [--config-addr ADDR]

  create   pair a new token with users.NAME and print it (once: only its hash is kept)
  revoke   unpair every token of users.NAME

Pairing is the operator's: it talks to the config service directly, on its
socket in the data directory (which only the daemon's user can reach), or
on --config-addr / CLAWMESH_CONFIG_ADDR (host:port in containers).
`

// tokenCmd runs `clawmesh token`.
func tokenCmd(args []string, out io.Writer) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(out, tokenUsage)
		return nil
	}
	if len(args) == 0 || (args[0] != "create" && args[0] != "revoke") {
		fmt.Fprint(os.Stderr, tokenUsage)
		return usageErrorf("token: want create or revoke")
	}
	fs := flag.NewFlagSet("token "+args[0], flag.ContinueOnError)
	var dir, user, addr string
	fs.StringVar(&dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fs.StringVar(&user, "user", "", "the users.<name> entry")
	fs.StringVar(&addr, "config-addr", os.Getenv("CLAWMESH_CONFIG_ADDR"), "config service address (env CLAWMESH_CONFIG_ADDR; default <data>/config.sock)")
	rest, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("token %s: unexpected argument %q", args[0], rest[0])
	}
	if user == "" {
		return usageErrorf("token %s: --user is required", args[0])
	}
	if addr == "" {
		data, err := datadir.Resolve(dir)
		if err != nil {
			return err
		}
		addr = datadir.ServiceSocket(data, "config", 0)
	}
	cc, err := grpcclient.Dial(addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	rpc := configv1.NewConfigServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	operator := &commonv1.Principal{PrincipalId: configschema.OperatorPrincipal, Operator: true, PeerUid: int32(os.Getuid()), PeerPid: int32(os.Getpid())}
	if args[0] == "revoke" {
		resp, err := rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: user})
		if err != nil {
			return tokenError("revoke", addr, err)
		}
		_, err = fmt.Fprintf(out, "revoked %d token(s) of %s\n", resp.GetRevoked(), user)
		return err
	}
	resp, err := rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: user})
	if err != nil {
		return tokenError("create", addr, err)
	}
	_, err = fmt.Fprintln(out, resp.GetToken())
	return err
}

// tokenError shows the config service's failure as a person reads it: the
// service's words without gRPC's "rpc error: code = ... desc =", and a
// service that does not answer (the stack is not running) with what to
// do about it.
func tokenError(cmd, addr string, err error) error {
	st, ok := status.FromError(err)
	switch {
	case !ok:
		return fmt.Errorf("token %s: %w", cmd, err)
	case st.Code() == codes.Unavailable:
		return fmt.Errorf("token %s: no config service answers at %s: is the stack running? (clawmesh up; in containers, its address is --config-addr): %s", cmd, addr, st.Message())
	}
	return fmt.Errorf("token %s: %s", cmd, st.Message())
}
