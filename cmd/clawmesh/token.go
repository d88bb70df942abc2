package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
on --config-addr / CLAWMESH_CONFIG_ADDR (host:port in containers). A
service that does not answer its health within 3 s, or the change
within 10 s, is named as such, with what to do.
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
	// A config service stopped (SIGSTOP) or hung held the command for
	// its whole deadline, 30 s, then printed "context deadline
	// exceeded", or in 2 s said the stack was not running (it was).
	// Its health, which any live process answers at once, is asked
	// first, briefly; the call then has a deadline a config write meets
	// unless the service's database stalls.
	hctx, hcancel := context.WithTimeout(context.Background(), tokenHealthWait)
	health, reason, err := healthOn(hctx, cc, "")
	hcancel()
	if err != nil && status.Code(err) != codes.Unimplemented {
		return tokenError(args[0], addr, err, false, "")
	}
	// Not refused when not SERVING: a call that needs only what the
	// service has (its database, not the bus) still succeeds. Said if it
	// fails.
	var unhealthy string
	if err == nil && health != healthpb.HealthCheckResponse_SERVING {
		unhealthy = health.String()
		if reason != "" {
			unhealthy += " (" + reason + ")"
		}
	}
	rpc := configv1.NewConfigServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), tokenCallWait)
	defer cancel()
	operator := &commonv1.Principal{PrincipalId: configschema.OperatorPrincipal, Operator: true, PeerUid: int32(os.Getuid()), PeerPid: int32(os.Getpid())}
	if args[0] == "revoke" {
		resp, err := rpc.RevokeToken(ctx, &configv1.RevokeTokenRequest{Principal: operator, User: user})
		if err != nil {
			return tokenError("revoke", addr, err, true, unhealthy)
		}
		_, err = fmt.Fprintf(out, "revoked %d token(s) of %s\n", resp.GetRevoked(), user)
		return err
	}
	resp, err := rpc.CreateToken(ctx, &configv1.CreateTokenRequest{Principal: operator, User: user})
	if err != nil {
		return tokenError("create", addr, err, true, unhealthy)
	}
	_, err = fmt.Fprintln(out, resp.GetToken())
	return err
}

// tokenHealthWait bounds the health check before the call: a live
// process answers it in milliseconds. tokenCallWait bounds the call, a
// config write (milliseconds, unless the database stalls); the tests
// shorten it.
var (
	tokenHealthWait = 3 * time.Second
	tokenCallWait   = 10 * time.Second
)

// tokenError shows the config service's failure as a person reads it: the
// service's words without gRPC's "rpc error: code = ... desc =", and a
// service that does not answer with what to do about it: the stack not
// running, or the service not answering though its socket takes
// connections (stopped, hung, its database stalled). call is true when
// the call failed (after the health check), unhealthy the health it
// gave when not SERVING.
func tokenError(cmd, addr string, err error, call bool, unhealthy string) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("token %s: %w", cmd, err)
	}
	code := st.Code()
	if code != codes.Unavailable && code != codes.DeadlineExceeded {
		return fmt.Errorf("token %s: %s", cmd, st.Message())
	}
	if !takesConnections(addr) {
		return fmt.Errorf("token %s: no config service answers at %s: is the stack running? (clawmesh up; in containers, its address is --config-addr): %s", cmd, addr, st.Message())
	}
	var detail string
	switch {
	case !call:
		detail = " (asked for its health)"
	case code == codes.DeadlineExceeded:
		// A write that did not finish in time may still be made.
		detail = fmt.Sprintf(" within %s; whether the token was %sd is unknown", tokenCallWait, cmd)
	}
	if unhealthy != "" {
		detail += "; its health: " + unhealthy
	}
	return fmt.Errorf("token %s: the config service at %s does not answer%s: it takes connections but is stopped, hung or waiting on its database; clawmesh doctor shows which process fails (the launcher restarts one that stays silent), then run this again",
		cmd, addr, detail)
}

// takesConnections reports whether something listens at addr (a socket
// path or host:port): a process stopped or hung still has its
// connections taken by the kernel.
func takesConnections(addr string) bool {
	network := "tcp"
	if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
