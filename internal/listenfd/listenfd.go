// Package listenfd hands listening sockets to a child process the way
// systemd's socket activation does: the sockets are descriptors 3, 4, …;
// LISTEN_FDS is their count and LISTEN_FDNAMES their names, separated by
// colons. The launcher passes the client socket so that it outlives the
// gateway; a gateway started by a systemd .socket unit reads it the same
// way.
package listenfd

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

const (
	envFDs   = "LISTEN_FDS"
	envNames = "LISTEN_FDNAMES"
	envPID   = "LISTEN_PID"
	// firstFD is the first passed descriptor (SD_LISTEN_FDS_START).
	firstFD = 3
)

// ErrNotListener: a passed descriptor is not a listening socket.
var ErrNotListener = errors.New("listenfd: passed descriptor is not a listening socket")

// Pass makes cmd start with files as its descriptors 3, 4, … under names.
// It replaces cmd.ExtraFiles and adds to cmd.Env (which must already hold
// the child's environment).
func Pass(cmd *exec.Cmd, names []string, files []*os.File) {
	cmd.ExtraFiles = files
	cmd.Env = append(cmd.Env, envFDs+"="+strconv.Itoa(len(files)), envNames+"="+strings.Join(names, ":"))
}

// Without returns env less the variables that describe passed
// descriptors: a process that starts others hands each what it passes
// (Pass), never what it was itself passed.
func Without(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == envFDs || k == envNames || k == envPID {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Listener returns the passed socket named name, or nil when none was
// passed under that name. The descriptors passed are this process's only
// when LISTEN_PID is unset (the launcher cannot know the pid before the
// fork) or names this process, as systemd sets it. A socket taken is
// struck from LISTEN_FDNAMES (its place kept, so that the others keep
// their descriptors), and the variables are removed once every socket
// is taken (or when they are another process's), so a child of this
// process does not take them for its own; asking for a name that was not
// passed leaves them for the process's other lookups (the gateway takes
// its client socket, then its gRPC socket as every service does).
func Listener(name string) (net.Listener, error) {
	count, names, pid := os.Getenv(envFDs), os.Getenv(envNames), os.Getenv(envPID)
	if count == "" {
		return nil, nil
	}
	if pid != "" && pid != strconv.Itoa(os.Getpid()) {
		unset()
		return nil, nil
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("listenfd: %s=%q is not a count", envFDs, count)
	}
	list := strings.Split(names, ":")
	for i := range n {
		if i >= len(list) || list[i] != name {
			continue
		}
		list[i] = ""
		if strings.Join(list, "") == "" {
			unset()
		} else {
			os.Setenv(envNames, strings.Join(list, ":"))
		}
		f := os.NewFile(uintptr(firstFD+i), name)
		ln, err := net.FileListener(f)
		f.Close() // FileListener holds its own duplicate
		if err != nil {
			return nil, fmt.Errorf("%w: descriptor %d (%s): %w", ErrNotListener, firstFD+i, name, err)
		}
		relisten(ln)
		return ln, nil
	}
	return nil, nil
}

// ClientSocket names the clients' socket the launcher passes the gateway.
const ClientSocket = "clawmesh-client"

// DurableSocket names the durable bridge's private socket, which the
// launcher holds while the bridge is dormant and passes it when it wakes.
const DurableSocket = "collie-durable"

// GRPCSocket names a service's own gRPC socket: the launcher binds it
// before a service's first run, so that its readiness check waits in the
// socket's backlog instead of retrying the connection, and holds it while
// a service is dormant (upload-staging), passing it at each run.
const GRPCSocket = "clawmesh-grpc"

// relisten calls listen again on ln, a socket another process bound and
// listened on: a Unix socket's clients learn its server's pid from the
// kernel (SO_PEERCRED), which names the process that last called listen
// on it. Without this a replica's first run was its launcher to them,
// and a stopped replica could not be told from a slow one
// (grpcclient's peer.go). The backlog asked is clamped to somaxconn, as
// Go's own listen's is. A failure changes nothing the socket does.
func relisten(ln net.Listener) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) { _ = syscall.Listen(int(fd), math.MaxUint16) })
}

func unset() {
	os.Unsetenv(envFDs)
	os.Unsetenv(envNames)
	os.Unsetenv(envPID)
}
