package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/launcher"
)

const healthUsage = `usage: clawmesh health [ADDR] [--service NAME] [--timeout D] [--config-dir DIR]

Asks a Clawmesh process for its gRPC health and exits 0 only when it
answers SERVING; otherwise prints the status and the reason the process
gives (its database or the bus unreachable, shutting down) and exits 1.
ADDR is a socket path or host:port, by default CLAWMESH_LISTEN (a
wildcard host such as 0.0.0.0 is asked on loopback), so the one command
serves as every container's health check and as an exec probe.

With --config-dir (a data directory clawmesh up runs on), ADDR may be a
process's name (session, plugin-sandbox.1: its socket in DIR), and an
answer other than SERVING adds what the launcher knows of that process:
restarting after a crash (the attempt, the last exit) or hung (silent
for how long), where the check alone said "connection refused" or
"context deadline exceeded". A SERVING answer adds a line counting the
channel messages kept on disk and not delivered yet, when there are any
(clawmesh spool list).
`

// ErrNotServing: the process answered, but not SERVING.
var ErrNotServing = errors.New("not serving")

// healthCmd runs `clawmesh health`.
func healthCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	service := fs.String("service", "", "the service name to ask about (default: the whole process)")
	timeout := fs.Duration("timeout", 3*time.Second, "longest wait for the answer")
	dirFlag := fs.String("config-dir", "", "data directory of the stack (clawmesh up): ADDR may name a process, and the launcher's state of it is added to a failure")
	rest, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, healthUsage, fs)
		return nil
	}
	var usage *exitError
	if errors.As(err, &usage) {
		// A probe knows 0 and 1; Docker reserves 2 of a health check.
		return usage.err
	}
	if err != nil {
		return err
	}
	if len(rest) > 1 {
		return fmt.Errorf("health: want at most one ADDR, got %q", rest)
	}
	addr := os.Getenv("CLAWMESH_LISTEN")
	if len(rest) == 1 {
		addr = rest[0]
	}
	if addr == "" {
		return errors.New("health: no ADDR and no CLAWMESH_LISTEN: pass the process's socket path or host:port (under clawmesh up, <data>/<process>.sock)")
	}
	var dir string
	if *dirFlag != "" {
		if dir, err = filepath.Abs(*dirFlag); err != nil {
			return fmt.Errorf("health: --config-dir: %w", err)
		}
		if name, replica, ok := processName(addr); ok {
			addr = datadir.ServiceSocket(dir, name, replica)
		}
	}
	addr = dialable(addr)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	status, reason, err := checkHealth(ctx, addr, *service)
	if err != nil {
		return withLauncherState(dir, addr, healthError(addr, *service, err))
	}
	if status != healthpb.HealthCheckResponse_SERVING {
		if reason != "" {
			return withLauncherState(dir, addr, fmt.Errorf("health %s: %w: %s (%s)", addr, ErrNotServing, status, reason))
		}
		return withLauncherState(dir, addr, fmt.Errorf("health %s: %w: %s", addr, ErrNotServing, status))
	}
	if _, err := fmt.Fprintln(out, status); err != nil {
		return err
	}
	if dir != "" {
		// Where an operator looks besides status: the gateway's
		// health cannot count files on this host, so the command does.
		if line := spoolSummary(spoolWaiting(dir)); line != "" {
			_, err = fmt.Fprintln(out, line)
		}
	}
	return err
}

// healthError says why addr gave no health and what to do, without
// gRPC's framing ("rpc error: code = Unavailable desc = connection
// error: ...", which named neither a missing process nor the flag).
func healthError(addr, service string, err error) error {
	st, ok := status.FromError(err)
	switch {
	case !ok:
	case st.Code() == codes.NotFound:
		return fmt.Errorf("health %s: the process answers no health named %q (none yet while it starts, or none at all): leave --service out to ask the whole process, or ask %s", addr, service, grpcserver.Liveness)
	case st.Code() == codes.Unavailable && !strings.Contains(addr, "://") && !takesConnections(addr):
		return fmt.Errorf("health %s: nothing listens there: the process is not running, or listens elsewhere (its --listen or CLAWMESH_LISTEN): %s", addr, st.Message())
	}
	return fmt.Errorf("health %s: %w", addr, err)
}

// dialable turns a listen address into one to dial: a wildcard host
// (0.0.0.0, ::, none) is the local host, and anything that is not
// host:port a socket path, made absolute. A relative path was dialled
// as a host name and failed with gRPC's "no children to pick from",
// which named neither the path nor a socket.
func dialable(addr string) string {
	if strings.HasPrefix(addr, "/") || strings.Contains(addr, "://") {
		return addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if abs, err := filepath.Abs(addr); err == nil {
			return abs
		}
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		return net.JoinHostPort("127.0.0.1", port)
	case "::":
		return net.JoinHostPort("::1", port)
	}
	return addr
}

// checkHealth asks addr once and returns the status and the reason the
// process attached to a NOT_SERVING answer.
func checkHealth(ctx context.Context, addr, service string) (healthpb.HealthCheckResponse_ServingStatus, string, error) {
	cc, err := grpcclient.Dial(addr)
	if err != nil {
		return 0, "", err
	}
	defer cc.Close()
	return healthOn(ctx, cc, service)
}

// healthOn is checkHealth on a connection open already.
func healthOn(ctx context.Context, cc *grpc.ClientConn, service string) (healthpb.HealthCheckResponse_ServingStatus, string, error) {
	var trailer metadata.MD
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.Trailer(&trailer))
	if err != nil {
		return 0, "", err
	}
	return resp.GetStatus(), strings.Join(trailer.Get(grpcserver.ReasonTrailer), "; "), nil
}

// processNamePattern is a process of the stack as the launcher names it:
// a service, and for a replica past the first its number.
var processNamePattern = regexp.MustCompile(`^([a-z][a-z-]{0,40})(?:\.([1-9][0-9]?))?$`)

// processName reads addr as a process's name (plugin-sandbox.1): its
// service and replica.
func processName(addr string) (string, int, bool) {
	m := processNamePattern.FindStringSubmatch(addr)
	if m == nil {
		return "", 0, false
	}
	replica := 0
	if m[2] != "" {
		replica, _ = strconv.Atoi(m[2])
	}
	return m[1], replica, true
}

// withLauncherState adds to err, a failed health check of the socket
// addr, what the launcher supervising the data directory dir knows of
// the process behind it, when it knows more (describeProcess).
func withLauncherState(dir, addr string, err error) error {
	if dir == "" {
		return err
	}
	ls, rerr := launcher.ReadProcessStates(dir)
	if rerr != nil {
		return err
	}
	for name, ps := range ls.Processes {
		service, replica, ok := processName(name)
		if !ok || datadir.ServiceSocket(dir, service, replica) != addr {
			continue
		}
		if word, why := describeProcess(&ls, ps, "", time.Now()); word != "" {
			return fmt.Errorf("%w; the launcher says %s: %s (%s)", err, name, word, why)
		}
	}
	return err
}
