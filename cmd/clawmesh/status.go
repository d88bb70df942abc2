package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/launcher"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
)

const statusUsage = `usage: clawmesh status [--token T] [--config-dir DIR] [--socket PATH]

Asks the running stack for its status (the socket's status method) and
prints it readably: the version, the socket, the open sessions of the
caller and each service's state (serving, not_serving, unreachable,
unknown, dormant; one not serving with the reason the gateway recorded),
and, when the gateway bound the operator without
the config service (config away: no other caller can initialize), a
caller line saying so. Exits 0 when every service serves or is dormant,
1 otherwise (or when the stack does not answer). While clawmesh up is
still starting (the gateway, which answers, starts last) it says so and
what the start waits for, and exits 1. On the data directory's own
socket it adds what the launcher knows and the gateway cannot see: a
service it is restarting after a crash says "restarting" with the
attempt and the last exit, and one that stopped answering its health
check (hung, or stopped with SIGSTOP) "hung" with how long it has been
silent, where the gateway said "unreachable". clawmesh call status prints
the gateway's answer alone, as JSON.
`

// statusReply is the status method's result (docs/spec.md §5).
type statusReply struct {
	ServerVersion       string            `json:"server_version"`
	ProtocolVersion     int               `json:"protocol_version"`
	ActiveSessions      int64             `json:"active_sessions"`
	SessionIDs          []string          `json:"session_ids"`
	ConfigDir           string            `json:"config_dir"`
	Socket              string            `json:"local_ipc_endpoint"`
	Services            map[string]string `json:"services"`
	SessionsUnavailable string            `json:"sessions_unavailable"`
	// withoutConfig is why the gateway bound this caller, the operator,
	// without the config service (initialize's config_unavailable).
	withoutConfig string
	// reasons is why each service not serving is not (reasons).
	reasons map[string]string
	// launcher is what the launcher of the stack says of its processes
	// (launcherStates); nil when it says nothing.
	launcher *launcher.ProcessStates
	// launcherRefused is why the launcher's state file was refused
	// (launcher.ErrStatesRefused): said, not read as no launcher.
	launcherRefused error
	// spool is the channel spool's kept messages (spoolWaiting), read
	// with launcher.
	spool          []spoolWait
	spoolTruncated bool
}

// ErrServicesDown: status answered, and some service is neither serving
// nor dormant.
var ErrServicesDown = errors.New("not every service is serving")

// statusCmd runs `clawmesh status`.
func statusCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var sf socketFlags
	sf.register(fs)
	rest, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, statusUsage, fs)
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		fmt.Fprint(os.Stderr, statusUsage)
		return usageErrorf("status: want no arguments, got %q", rest)
	}
	c, err := sf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.Call("status", map[string]any{})
	if err != nil {
		return cliError(err)
	}
	var st statusReply
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("status: unreadable answer: %w", err)
	}
	st.withoutConfig = sf.withoutConfig
	st.launcher, st.launcherRefused = launcherStates(sf)
	if st.launcher != nil {
		if dir, err := datadir.Resolve(sf.dir); err == nil {
			st.spool, st.spoolTruncated = spoolWaiting(dir)
		}
	}
	st.reasons = reasons(c, st)
	return printStatus(out, st)
}

// reasons is, for each service neither serving nor dormant, why (the
// health method's last_error): status carries the state word alone, and
// "unreachable" or "not_serving" named no cause, which only doctor or
// clawmesh call health showed. Nil when every service serves, or health
// does not answer (the state words are still printed).
func reasons(c *rpcclient.Client, st statusReply) map[string]string {
	down := false
	for _, state := range st.Services {
		down = down || (state != "serving" && state != "dormant")
	}
	if !down {
		return nil
	}
	raw, err := c.Call("health", map[string]any{})
	if err != nil {
		return nil
	}
	var h struct {
		Components map[string]struct {
			LastError *string `json:"last_error"`
		} `json:"components"`
	}
	if json.Unmarshal(raw, &h) != nil {
		return nil
	}
	out := make(map[string]string, len(h.Components))
	for name, comp := range h.Components {
		if comp.LastError != nil && *comp.LastError != "" {
			out[name] = *comp.LastError
		}
	}
	return out
}

// printStatus writes st as aligned lines; ErrServicesDown names the
// services that are neither serving nor dormant.
func printStatus(out io.Writer, st statusReply) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "server\t%s (protocol %d)\n", st.ServerVersion, st.ProtocolVersion)
	fmt.Fprintf(w, "socket\t%s\n", st.Socket)
	fmt.Fprintf(w, "data dir\t%s\n", st.ConfigDir)
	switch {
	case st.SessionsUnavailable != "":
		fmt.Fprintf(w, "sessions\tunknown (%s)\n", st.SessionsUnavailable)
	case len(st.SessionIDs) == 0:
		fmt.Fprintf(w, "sessions\t%d open\n", st.ActiveSessions)
	default:
		fmt.Fprintf(w, "sessions\t%d open: %s\n", st.ActiveSessions, strings.Join(st.SessionIDs, ", "))
	}
	if st.withoutConfig != "" {
		// The gateway's fallback (docs/spec.md §4): it binds the
		// operator by its uid alone, and every other caller's
		// initialize fails until config answers.
		fmt.Fprintf(w, "caller\tthe operator, bound without the config service (%s): until it answers, no other caller can initialize\n", st.withoutConfig)
	}
	if st.launcherRefused != nil {
		fmt.Fprintf(w, "launcher\t%v: each service's state below is the gateway's alone\n", st.launcherRefused)
	}
	names := make([]string, 0, len(st.Services))
	for name := range st.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	var down []string
	fmt.Fprintln(w, "services:")
	now := time.Now()
	for _, name := range names {
		state := st.Services[name]
		if word, why := launcherSays(st.launcher, name, state, now); word != "" {
			down = append(down, name+" "+word)
			state = word + " (" + why + ")"
		} else if state != "serving" && state != "dormant" {
			down = append(down, name+" "+state)
			if why := st.reasons[name]; why != "" {
				state += " (" + why + ")"
			}
		}
		fmt.Fprintf(w, "  %s\t%s\n", name, state)
	}
	if lines := spoolLines(st.spool, st.spoolTruncated, now); len(lines) > 0 {
		// Not a failure: kept messages are delivered when their plugin
		// is bound to the alias again.
		fmt.Fprintln(w, "channel messages kept, not delivered yet (alias → plugin):")
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(down) > 0 {
		return fmt.Errorf("%w: %s", ErrServicesDown, strings.Join(down, ", "))
	}
	return nil
}

// launcherStates is what the launcher supervising the stack says of its
// processes (launcher.ReadProcessStates), when the stack asked is the
// one of the data directory resolved: the socket is that directory's
// (no other named). Nil when there is none to read; with why, when the
// file was refused (launcher.ErrStatesRefused).
func launcherStates(sf socketFlags) (*launcher.ProcessStates, error) {
	dir, err := datadir.Resolve(sf.dir)
	if err != nil {
		return nil, nil
	}
	socket := sf.socket
	if socket == "" {
		socket = os.Getenv("ZEROCLAW_SOCKET")
	}
	if socket != "" && filepath.Clean(socket) != datadir.Socket(dir) {
		return nil, nil
	}
	ps, err := launcher.ReadProcessStates(dir)
	if errors.Is(err, launcher.ErrStatesRefused) {
		return nil, err
	}
	if err != nil {
		return nil, nil
	}
	return &ps, nil
}

// launcherSays is the state of the service name (gateway is what the
// gateway said of it) as the launcher knows it, with why: "restarting"
// while a run that exited waits for its next one or has not answered
// yet, "hung" while a run answers no health check. The gateway saw the
// first as "unreachable" with a dial error and the second as
// "unreachable (context deadline exceeded)". "" when the launcher knows
// nothing more: the gateway's word stands. A scaled service's replicas
// are each said, by name.
func launcherSays(ls *launcher.ProcessStates, name, gateway string, now time.Time) (string, string) {
	if ls == nil {
		return "", ""
	}
	procs := make([]string, 0, 1)
	for p := range ls.Processes {
		if p == name || strings.HasPrefix(p, name+".") {
			procs = append(procs, p)
		}
	}
	sort.Strings(procs)
	word := ""
	var whys []string
	for _, p := range procs {
		w, why := describeProcess(ls, ls.Processes[p], gateway, now)
		if w == "" {
			continue
		}
		if len(procs) > 1 {
			why = p + ": " + why
		}
		// One word for the service: hung before restarting.
		if word == "" || w == "hung" {
			word = w
		}
		whys = append(whys, why)
	}
	return word, strings.Join(whys, "; ")
}

// describeProcess is one process's state as the launcher knows it
// (launcherSays): "restarting" or "hung" with why, or "" when the
// launcher knows nothing the gateway (whose word for it is gateway, ""
// when not asked) does not.
func describeProcess(ls *launcher.ProcessStates, ps launcher.ProcessState, gateway string, now time.Time) (string, string) {
	exit := ""
	if ps.LastExit != "" {
		exit = fmt.Sprintf("last exit: %s, %s ago", ps.LastExit, ago(now, ps.ExitedAt))
	}
	switch {
	case ps.PID == 0 && ps.Restarts > 0:
		if wait := ps.RestartAt.Sub(now); wait > 0 {
			return "restarting", fmt.Sprintf("attempt %d in %s; %s", ps.Restarts, wait.Round(100*time.Millisecond), exit)
		}
		return "restarting", fmt.Sprintf("attempt %d starting; %s", ps.Restarts, exit)
	case !ps.SilentSince.IsZero():
		why := fmt.Sprintf("pid %d not answering health within %s, silent for %s", ps.PID, ls.ProbeEvery, ago(now, ps.SilentSince))
		if ls.Liveness > 0 {
			why += fmt.Sprintf("; the launcher restarts it after %s of silence", ls.Liveness)
		}
		return "hung", why
	case ps.Restarts > 0 && !ps.Answered && ls.Liveness > 0 && gateway != "serving":
		// Answered is known with liveness probing alone.
		return "restarting", fmt.Sprintf("attempt %d, pid %d started %s ago, not answering yet; %s", ps.Restarts, ps.PID, ago(now, ps.StartedAt), exit)
	}
	return "", ""
}

// ago is how long before now t was, rounded for a person.
func ago(now, t time.Time) time.Duration {
	d := now.Sub(t)
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
