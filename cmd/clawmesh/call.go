package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/clawmesh/clawmesh/internal/rpcclient"
)

const callUsage = `usage: clawmesh call METHOD [PARAMS_JSON] [--token T] [--config-dir DIR] [--socket PATH] [--timeout D]

Calls any method of the client socket as the operator (or the user of
--token) and prints the result as JSON. Notifications that arrive while
it waits (session/update of a prompt) are printed first, one JSON line
each. Example:

  clawmesh call session/new '{"agent_alias":"default"}'
  clawmesh call session/prompt '{"session_id":"sess_...","prompt":"/say hi"}'
`

// callCmd runs `clawmesh call`.
func callCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	var sf socketFlags
	sf.register(fs)
	timeout := fs.Duration("timeout", 5*time.Minute, "longest wait for the result")
	rest, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, callUsage, fs)
		return nil
	}
	if err != nil {
		return err
	}
	if *timeout <= 0 {
		// The client would wait its own 30 s instead: no limit is not
		// on offer, a turn is bounded by the stack anyway.
		return usageErrorf("call: --timeout %v: want a duration above zero, e.g. 10m", *timeout)
	}
	if len(rest) < 1 || len(rest) > 2 {
		fmt.Fprint(os.Stderr, callUsage)
		return usageErrorf("call: want METHOD and optional PARAMS_JSON")
	}
	var params any = map[string]any{}
	if len(rest) == 2 {
		if err := json.Unmarshal([]byte(rest[1]), &params); err != nil {
			return usageErrorf("call: PARAMS_JSON: %w", err)
		}
		switch params.(type) {
		case map[string]any, []any:
		default:
			// JSON-RPC params are structured; the daemon refuses
			// anything else as an invalid request.
			return usageErrorf("call: PARAMS_JSON: want a JSON object or array, not %s", rest[1])
		}
	}
	c, err := sf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	c.Timeout = *timeout
	c.OnFrame = func(f *rpcclient.Frame, raw []byte) {
		if len(f.ID) == 0 {
			fmt.Fprintf(out, "%s", raw)
		}
	}
	res, err := c.Call(rest[0], params)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("call %s: no answer within %v (--timeout): %w", rest[0], *timeout, err)
	}
	if err != nil {
		return cliError(err)
	}
	return printJSON(out, res)
}
