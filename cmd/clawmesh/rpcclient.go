package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/launcher"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
)

// socketFlags are the flags of the commands that talk to the running
// stack over its client socket.
type socketFlags struct {
	dir, socket, token string
	tokenSet           bool // --token given, if only empty
	// withoutConfig is initialize's config_unavailable once dial has
	// run: why the gateway bound the operator without the config
	// service ("" when config bound the caller).
	withoutConfig string
	// protocol and principal are initialize's protocol_version and
	// principal_id once dial has run (doctor shows them to a client).
	protocol  int
	principal string
}

func (f *socketFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fs.StringVar(&f.socket, "socket", "", "client socket (env ZEROCLAW_SOCKET; default <data>/daemon.sock)")
	// Not the flag's default: -h prints defaults, and the token is a
	// credential. dialWith reads the environment unless --token is given
	// (--token= is the operator's, whatever the environment holds).
	fs.Func("token", "paired auth_token to initialize with (env ZEROCLAW_TOKEN); none for the operator", func(v string) error {
		f.token, f.tokenSet = v, true
		return nil
	})
}

// dial connects to the stack's socket and initializes.
func (f *socketFlags) dial() (*rpcclient.Client, error) { return f.dialWith(nil) }

// dialWith connects and initializes, advertising capabilities (nil for
// none).
func (f *socketFlags) dialWith(capabilities map[string]any) (*rpcclient.Client, error) {
	path, up, named := f.socket, "clawmesh up", "--socket"
	if path == "" {
		path, named = os.Getenv("ZEROCLAW_SOCKET"), "ZEROCLAW_SOCKET"
	}
	// A named socket needs no data directory: resolving one failed a
	// container that gives the socket alone and no $HOME ("home
	// directory: $HOME is not defined").
	if path == "" {
		named = ""
		dir, err := datadir.Resolve(f.dir)
		if err != nil {
			return nil, err
		}
		path = datadir.Socket(dir)
		if f.dir != "" {
			up += " --config-dir " + dir
		}
	}
	// The launcher's socket is ZEROCLAW_SOCKET too (datadir.Socket): on
	// a data directory's own socket, what its launcher says is read
	// before dialling (launcherSaysFirst).
	var refused error
	if dir, derr := datadir.Resolve(f.dir); derr == nil && path == datadir.Socket(dir) {
		if err := launcherSaysFirst(dir); err != nil {
			if !errors.Is(err, launcher.ErrStatesRefused) {
				return nil, err
			}
			refused = err
		}
	}
	c, err := rpcclient.Dial(path)
	if err != nil {
		if refused != nil {
			return nil, fmt.Errorf("%w; %w", noStack(path, up, named, err), refused)
		}
		return nil, noStack(path, up, named, err)
	}
	c.Timeout = 60 * time.Second
	params := map[string]any{"protocol_version": 1}
	token := f.token
	if !f.tokenSet {
		token = os.Getenv("ZEROCLAW_TOKEN")
	}
	if token != "" {
		params["auth_token"] = token
	}
	if capabilities != nil {
		params["client_capabilities"] = capabilities
	}
	raw, err := c.Call("initialize", params)
	if err != nil {
		c.Close()
		return nil, cliError(err)
	}
	var init struct {
		ConfigUnavailable string `json:"config_unavailable"`
		ProtocolVersion   int    `json:"protocol_version"`
		PrincipalID       string `json:"principal_id"`
	}
	// Only these members are read; a result they do not fit leaves them
	// zero.
	_ = json.Unmarshal(raw, &init)
	f.withoutConfig, f.protocol, f.principal = init.ConfigUnavailable, init.ProtocolVersion, init.PrincipalID
	return c, nil
}

// noStack says that no stack answered on path and what to do: it asked
// "is the stack running? dial unix ...: no such file or directory" and
// named no fix. No socket file, or one nothing listens on (a stack
// that was killed), is a stack to start, with up, the command that
// starts one on this data directory; anything else (a socket of another
// user's) is said as it is. A socket named explicitly (named: --socket or
// ZEROCLAW_SOCKET) is served by a gateway up does not start there, or
// not only (a container's, compose's ./run/daemon.sock): it names that
// gateway, not up.
func noStack(path, up, named string, err error) error {
	if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("is the stack running? %w", err)
	}
	if named != "" {
		return fmt.Errorf("is the stack running? no stack listens on %s (named by %s): start the gateway that serves it, or point at another with --socket (%w)", path, named, err)
	}
	return fmt.Errorf("is the stack running? no stack listens on %s: start one with `%s`, or point at the one that runs with --config-dir or --socket (%w)", path, up, err)
}

// errStarting: the launcher of the data directory is starting the
// stack; the gateway does not answer yet.
var errStarting = errors.New("the stack is starting, not serving yet")

// launcherSaysFirst is what the launcher supervising the data directory
// dir says before its socket is dialled: errStarting (with what the start
// waits for) while it starts the stack, the gateway's state while it
// hangs, nil otherwise, or why its state file was refused
// (launcher.ErrStatesRefused). The launcher listens on the client socket
// before the services serve, and keeps it while the gateway is replaced:
// a dial succeeded, and initialize waited its 60 s in the socket's
// backlog for a gateway not started yet (a second start, the schemas
// there) or stopped, then said "i/o timeout"; and before it listens
// (PostgreSQL's start) no stack at all, with the advice to start one,
// which the lock refused.
func launcherSaysFirst(dir string) error {
	ls, err := launcher.ReadProcessStates(dir)
	if errors.Is(err, launcher.ErrNoLauncher) {
		// A launcher of the release before, which wrote its start state
		// to a file of its own (launcher.ReadOldStart), starting the
		// stack while the binaries were replaced.
		pid, st, oerr := launcher.ReadOldStart(dir)
		if oerr == nil {
			return startingErr(pid, st)
		}
		if errors.Is(oerr, launcher.ErrNoLauncher) {
			return nil
		}
		return oerr
	}
	if err != nil {
		return err
	}
	if ls.Starting != nil {
		return startingErr(ls.LauncherPID, *ls.Starting)
	}
	// A gateway restarting takes the connection waiting in the backlog
	// once it runs; one that hangs does not.
	if gw, ok := ls.Processes["gateway"]; ok {
		if word, why := describeProcess(&ls, gw, "", time.Now()); word == "hung" {
			return fmt.Errorf("the stack does not answer: gateway %s (%s; launcher pid %d)", word, why, ls.LauncherPID)
		}
	}
	return nil
}

func startingErr(pid int, st launcher.StartState) error {
	took := time.Since(st.Since).Round(time.Second)
	return fmt.Errorf("%w: %s (launcher pid %d, starting for %s)", errStarting, st.WaitsFor, pid, took)
}

// waitPoll is how often dialWait tries the socket again.
const waitPoll = 200 * time.Millisecond

// dialWait is dialWith that, while no stack listens on the socket yet,
// tries again for up to wait: a client container starts beside its
// gateway (deploy/k8s/examples/client.yaml) and may run first, and
// failing at once made it exit 1 and restart under a growing backoff.
// Any other failure (a socket it may not open, initialize refused) is
// not a gateway still starting, and returns at once.
func (f *socketFlags) dialWait(capabilities map[string]any, wait time.Duration) (*rpcclient.Client, error) {
	deadline := time.Now().Add(wait)
	for {
		c, err := f.dialWith(capabilities)
		if err == nil || wait <= 0 || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, errStarting)) {
			return c, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("waited %s (--wait): %w", wait, err)
		}
		time.Sleep(min(waitPoll, left))
	}
}

// cliError shows a daemon's error object as a person reads it.
func cliError(err error) error {
	var re *rpcclient.RPCError
	if errors.As(err, &re) {
		return errors.New(re.Describe())
	}
	return err
}
