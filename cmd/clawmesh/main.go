// Command clawmesh is the CLI: `clawmesh up` (alias `daemon`) runs the
// whole stack on this host.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "clawmesh: %v\n", err)
		os.Exit(1)
	}
}

const usage = `usage: clawmesh <command> [flags]

commands:
  up, daemon   run the whole stack on this host (see clawmesh up -h)
  version      print the version
`

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("no command")
	}
	switch args[0] {
	case "up", "daemon":
		return up(args[1:])
	case "version", "--version":
		return printVersion()
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	fmt.Fprint(os.Stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
