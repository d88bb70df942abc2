package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseArgs parses args with fs, flags anywhere: before, between or after
// the positional arguments, which it returns in order. "--" ends the
// flags. An unknown flag is an error naming it.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, helpRequested{fs}
			}
			return nil, usageErrorf("%s: %w (see clawmesh %s -h)", fs.Name(), err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// fs.Parse stops at the first positional, or after "--".
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// usageOf prints fs's flags, for -h.
func usageOf(w io.Writer, head string, fs *flag.FlagSet) {
	fmt.Fprint(w, head)
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	if b.Len() > 0 {
		fmt.Fprint(w, "\nflags:\n"+b.String())
	}
}

// helpRequested is -h given to fs. A command with a usage text of its own
// prints it (errors.Is(err, flag.ErrHelp)); for any other, main prints the
// flags of fs and exits 0.
type helpRequested struct{ fs *flag.FlagSet }

func (h helpRequested) Error() string { return flag.ErrHelp.Error() }
func (h helpRequested) Unwrap() error { return flag.ErrHelp }

// isHelp reports whether a command's first argument asks for its usage.
func isHelp(arg string) bool { return arg == "help" || arg == "-h" || arg == "--help" }
