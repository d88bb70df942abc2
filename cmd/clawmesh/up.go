package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/launcher"
	"github.com/clawmesh/clawmesh/internal/logging"
	"github.com/clawmesh/clawmesh/internal/service"
	"github.com/clawmesh/clawmesh/internal/version"
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

const upUsage = `usage: clawmesh up [--config-dir DIR] [--set PROP=VALUE]... [--set-file FILE]
                  [--scale SERVICE=N]... [--ephemeral] [--liveness-timeout D]
                  [--ready-timeout D] [--bin-dir DIR] [--log-level LEVEL]

Runs the whole stack on this host in the foreground (alias: daemon): a
PostgreSQL cluster of the machine's binaries in the data directory (or
DATABASE_URL), NATS embedded (or NATS_URL), the services and the gateway,
each supervised and restarted when it dies. Clients connect to
<data>/daemon.sock. Ctrl-C, SIGTERM or SIGHUP (the terminal closing)
stops everything it started.
`

// up runs `clawmesh up`; out receives the usage of -h.
func up(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	var (
		dir, binDir, logLevel, setFile string
		ephemeral                      bool
		sets, scales                   multiFlag
		liveness, ready                time.Duration
	)
	fs.StringVar(&dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fs.StringVar(&binDir, "bin-dir", "", "folder of the service binaries (default: beside clawmesh)")
	fs.StringVar(&logLevel, "log-level", "", "launcher log level")
	fs.BoolVar(&ephemeral, "ephemeral", false, "stop the stack 1 s after the last client disconnects")
	fs.Var(&sets, "set", "config property prop=value, e.g. rpc.max_local_connections=64 (repeatable; visible in ps: put secrets in --set-file)")
	fs.StringVar(&setFile, "set-file", "", "file of prop=value lines committed at start like --set (# starts a comment)")
	fs.Var(&scales, "scale", "replicas of a service, e.g. plugin-sandbox=3 (repeatable)")
	fs.DurationVar(&liveness, "liveness-timeout", launcher.DefaultLiveness,
		"kill and restart a process that leaves its health check unanswered this long; 0 disables")
	fs.DurationVar(&ready, "ready-timeout", launcher.DefaultReadyTimeout,
		"give up the start when a process makes no progress this long (its health's reason unchanged; at most 10 times this in all)")
	rest, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, upUsage, fs)
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("up: unexpected argument %q", rest[0])
	}
	// A negative timeout is a typo, not a choice: the launcher would read
	// it as "disabled" and the stack would run without its liveness probe.
	if liveness < 0 {
		return usageErrorf("--liveness-timeout %s: want a duration of 0 or more (0 disables the probe)", liveness)
	}
	if ready < time.Second {
		return usageErrorf("--ready-timeout %s: want a duration of at least 1s", ready)
	}
	if setFile != "" {
		fromFile, err := readSetFile(setFile)
		if err != nil {
			return err
		}
		sets = append(fromFile, sets...)
	}
	data, err := datadir.Resolve(dir)
	if err != nil {
		return err
	}
	scale := map[string]int{}
	for _, s := range scales {
		name, n, ok := strings.Cut(s, "=")
		count, err := strconv.Atoi(n)
		if !ok || err != nil {
			return usageErrorf("--scale %q: want service=N", s)
		}
		scale[name] = count
	}
	if err := launcher.CheckScale(scale); err != nil {
		return usageErrorf("%w", err)
	}
	// Typed and checked against the schema here, so a bad --set fails
	// before anything starts (the config service checks it again, with the
	// whole document).
	for _, s := range sets {
		prop, raw, ok := strings.Cut(s, "=")
		if prop = strings.TrimSpace(prop); !ok || prop == "" {
			return usageErrorf("--set %q: want prop=value", s)
		}
		if _, err := configschema.ParseText(prop, raw); err != nil {
			return usageErrorf("--set %s: %w", prop, err)
		}
	}
	log, err := logging.New("clawmesh", logLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck

	if liveness == 0 {
		liveness = -1 // the launcher's "disabled"
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals()...)
	defer stop()
	err = launcher.Run(ctx, launcher.Config{
		DataDir:      data,
		BinDir:       binDir,
		DatabaseURL:  os.Getenv("DATABASE_URL"),
		NATSURL:      os.Getenv("NATS_URL"),
		Sets:         sets,
		Scale:        scale,
		Ephemeral:    ephemeral,
		Liveness:     liveness,
		ReadyTimeout: ready,
		Log:          log,
	})
	switch {
	case errors.Is(err, launcher.ErrEphemeralDone):
		return nil
	case errors.Is(err, launcher.ErrInterrupted):
		// The shell's convention for a command ended by SIGINT; the
		// stack was stopped cleanly, and the message says why it is
		// not up.
		return &exitError{code: exitInterrupted, err: errors.New("interrupted while starting; everything started was stopped")}
	}
	return err
}

// stopSignals are the signals that stop the stack in order. SIGHUP is one:
// the terminal of a foreground `clawmesh up` closing (a window shut, an
// ssh session dropped) otherwise killed the launcher at once, its
// children stopped all together by their parent-death signal and their
// sockets left behind. Not when it is ignored (nohup): Notify would undo
// that.
func stopSignals() []os.Signal {
	sigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}

// exitInterrupted is the exit status of `clawmesh up` interrupted while
// starting: 128 + SIGINT. A stop once the stack is up exits 0.
const exitInterrupted = 130

// exitUsage is the exit status of a command line the command cannot run
// (an unknown command or flag, a missing or extra argument, a value of
// the wrong type), as the flag package's own: a script tells "called
// wrongly" from "ran and failed" (1).
const exitUsage = 2

// usageErrorf is a usage error: exit status exitUsage.
func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// exitError is an error with its own exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// maxSetFileBytes bounds a --set-file: the overrides it holds may be at
// most service.MaxStartupSetsBytes, and this leaves room for comments.
// Read whole without a bound, a file named by mistake (a log of
// gigabytes, /dev/zero) filled the launcher's memory first.
const maxSetFileBytes = 4 * service.MaxStartupSetsBytes

// readSetFile reads prop=value lines; blank lines and lines starting with
// # are skipped, and spaces around the "=" dropped.
func readSetFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--set-file: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxSetFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--set-file: %w", err)
	}
	if len(raw) > maxSetFileBytes {
		return nil, fmt.Errorf("--set-file %s: larger than %d bytes, more than a file of --set values may be", path, maxSetFileBytes)
	}
	var sets []string
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		prop, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("--set-file %s:%d: want prop=value", path, i+1)
		}
		// "prop = value", as config files are often written: the value
		// kept its leading space ("agents.default.model = gpt-4o" set
		// the model " gpt-4o"), when the line's ends were trimmed
		// already. A JSON string keeps spaces on purpose.
		sets = append(sets, strings.TrimSpace(prop)+"="+strings.TrimSpace(value))
	}
	return sets, nil
}

func printVersion() error {
	fmt.Printf("clawmesh %s (protocol %d)\n", version.Version, version.Protocol)
	return nil
}
