// Command clawmesh is the CLI: `clawmesh up` (alias `daemon`) runs the
// whole stack on this host.
package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

func main() {
	err := run(os.Args[1:])
	var help helpRequested
	if errors.As(err, &help) {
		usageOf(os.Stdout, subUsage(help.fs.Name()), help.fs)
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "clawmesh: %v\n", err)
		code := 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
		os.Exit(code)
	}
}

const usage = `usage: clawmesh <command> [flags]

commands:
  up, daemon   run the whole stack on this host (see clawmesh up -h)
  chat         talk to an agent in the terminal (streams, approvals inline)
  call         call any method of the client socket and print the result
  status       print the running stack's status: sessions, each service's state
  doctor       check the machine, the data directory and a running stack; say what to fix
  config       get, set, list or delete config properties of the running stack
  token        pair (create) or unpair (revoke) a user's auth token
  plugin       list, search, install, remove, inspect and sign plugins
  spool        list or drop the channel messages kept on disk, not delivered yet
  health       exit 0 only if a process's gRPC health is SERVING (container probes)
  bus          bus credentials and nats-server config for an external NATS (containers)
  version      print the version

Exit status: 0 done, 1 failed, 2 the command line is wrong (health: 1).
`

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return usageErrorf("no command")
	}
	switch args[0] {
	case "up", "daemon":
		return up(args[1:], os.Stdout)
	case "config":
		return configCmd(args[1:], os.Stdout)
	case "call":
		return callCmd(args[1:], os.Stdout)
	case "status":
		return statusCmd(args[1:], os.Stdout)
	case "chat":
		return chatCmd(args[1:], os.Stdin, os.Stdout)
	case "doctor":
		return doctorCmd(args[1:], os.Stdout)
	case "token":
		return tokenCmd(args[1:], os.Stdout)
	case "plugin":
		return pluginCmd(args[1:], os.Stdout)
	case "spool":
		return spoolCmd(args[1:], os.Stdout)
	case "health":
		return healthCmd(args[1:], os.Stdout)
	case "bus":
		return busCmd(args[1:], os.Stdout)
	case "version", "--version":
		if len(args) > 1 {
			return usageErrorf("version: unexpected argument %q", args[1])
		}
		return printVersion()
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	if strings.HasPrefix(args[0], "-") {
		// Flags go anywhere after the command, not before it: say so
		// rather than call the flag an unknown command.
		cmd := "call"
		for _, a := range args[1:] {
			if slices.Contains(commands, a) {
				cmd = a
				break
			}
		}
		return usageErrorf("flag %q before the command: flags follow it, e.g. clawmesh %s %s ...", args[0], cmd, args[0])
	}
	fmt.Fprint(os.Stderr, usage)
	return usageErrorf("unknown command %q", args[0])
}

// commands are the command names run knows.
var commands = []string{"up", "daemon", "config", "call", "status", "chat", "doctor", "token", "plugin", "spool", "health", "bus", "version"}

// subUsages are the usage texts listing subcommands, by command.
var subUsages = map[string]string{"config": configUsage, "plugin": pluginUsage, "token": tokenUsage, "spool": spoolUsage}

// subUsage is the head of the -h of the command named name: for a
// subcommand (`config set`), what it takes and does from its line in its
// command's usage. It printed "usage: clawmesh config set [flags]" and
// the flags alone: no PROP=VALUE, no word of what it does.
func subUsage(name string) string {
	generic := "usage: clawmesh " + name + " [flags]\n"
	cmd, sub, ok := strings.Cut(name, " ")
	if !ok || subUsages[cmd] == "" {
		return generic
	}
	lines := strings.Split(subUsages[cmd], "\n")
	for i, l := range lines {
		if l != "  "+sub && !strings.HasPrefix(l, "  "+sub+" ") {
			continue
		}
		// "  SYNOPSIS   what it does", then lines indented as deep that
		// go on with what it does.
		rest := strings.TrimPrefix(l, "  ")
		synopsis, desc := rest, ""
		if at := strings.Index(rest, "  "); at >= 0 {
			synopsis, desc = rest[:at], strings.TrimSpace(rest[at:])
		}
		for _, more := range lines[i+1:] {
			if len(more) < 4 || strings.TrimSpace(more[:4]) != "" {
				break
			}
			desc += "\n" + strings.TrimSpace(more)
		}
		args := strings.TrimSpace(strings.TrimPrefix(synopsis, sub))
		head := "usage: clawmesh " + cmd + " " + sub
		if args != "" {
			head += " " + args
		}
		return head + " [flags]\n\n" + desc + "\n"
	}
	return generic
}
