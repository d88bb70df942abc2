package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// A command line the command cannot run exits 2, one that ran and failed
// exits 1, so a script tells "called wrongly" from "it failed"; both say
// why on the last line of stderr. Usage errors used to exit 1 like any
// failure. health exits 1 for both: a probe knows 0 and 1 (Docker
// reserves 2).
func TestUsageErrorsExitTwo(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none")
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{nil, 2, "no command"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		// "flags may go anywhere" is after the command: one before it is
		// named as such, not as an unknown command "--config-dir".
		{[]string{"--config-dir", none, "call", "status"}, 2, `flag "--config-dir" before the command: flags follow it, e.g. clawmesh call --config-dir`},
		{[]string{"up", "--bogus"}, 2, "flag provided but not defined: -bogus (see clawmesh up -h)"},
		{[]string{"up", "extra", "--config-dir", none}, 2, `unexpected argument "extra"`},
		{[]string{"up", "--config-dir", none, "--set", "rpc.max_local_connections=abc"}, 2, "rpc.max_local_connections"},
		// The launcher's own checks of --scale exited 1, as if the
		// stack had failed.
		{[]string{"up", "--config-dir", none, "--scale", "plugin-sandbox=65"}, 2, "replicas must be between 1 and 64"},
		{[]string{"up", "--config-dir", none, "--scale", "plugin-sandbox=0"}, 2, "replicas must be between 1 and 64"},
		{[]string{"up", "--config-dir", none, "--scale", "session=2"}, 2, "only plugin-sandbox runs several replicas"},
		// A negative timeout disabled the probe without a word, as 0 does.
		{[]string{"up", "--config-dir", none, "--liveness-timeout", "-5s"}, 2, "--liveness-timeout -5s: want a duration of 0 or more (0 disables the probe)"},
		{[]string{"up", "--config-dir", none, "--ready-timeout", "0s"}, 2, "--ready-timeout 0s: want a duration of at least 1s"},
		{[]string{"call"}, 2, "want METHOD"},
		{[]string{"call", "status", "{bad", "--config-dir", none}, 2, "PARAMS_JSON"},
		// JSON, but not params: refused here, before the stack is dialled
		// (it said "is the stack running?" or the daemon's -32600).
		{[]string{"call", "status", "null", "--config-dir", none}, 2, "PARAMS_JSON: want a JSON object or array"},
		{[]string{"call", "status", `"x"`, "--config-dir", none}, 2, "PARAMS_JSON: want a JSON object or array"},
		{[]string{"call", "status", "--timeout", "abc"}, 2, "see clawmesh call -h"},
		{[]string{"chat", "extra", "--config-dir", none}, 2, `unexpected argument "extra"`},
		{[]string{"doctor", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"config"}, 2, "no command"},
		{[]string{"config", "get", "--tokn", "x"}, 2, "see clawmesh config get -h"},
		{[]string{"config", "delete", "--config-dir", none}, 2, "want one PROP"},
		{[]string{"config", "set", "rpc.max_local_connections=abc", "--config-dir", none}, 2, "not JSON of type integer"},
		{[]string{"token", "create", "--config-dir", none}, 2, "--user is required"},
		{[]string{"token", "bogus"}, 2, "want create or revoke"},
		{[]string{"plugin", "install", "--config-dir", none}, 2, "want one SOURCE"},
		{[]string{"plugin", "bogus"}, 2, `unknown command "bogus"`},
		{[]string{"bus", "users", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"version", "extra"}, 2, `version: unexpected argument "extra"`},
		{[]string{"health", "--bogus"}, 1, "flag provided but not defined"},
		{[]string{"health", "a", "b"}, 1, "at most one ADDR"},
		// Failures, not usage errors.
		{[]string{"call", "status", "--config-dir", none}, 1, "is the stack running?"},
		{[]string{"config", "get", "--config-dir", none}, 1, "is the stack running?"},
		{[]string{"bus", "users", "--config-dir", none}, 1, "bus init"},
		{[]string{"health", none}, 1, "health"},
	} {
		_, stderr, code := runCLI(t, tc.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != tc.code || !strings.HasPrefix(last, "clawmesh: ") || !strings.Contains(last, tc.says) {
			t.Errorf("clawmesh %s: exit %d (want %d), last line %q (want %q)", strings.Join(tc.args, " "), code, tc.code, last, tc.says)
		}
	}
}

// A command that found no stack on its socket asked "is the stack
// running? dial unix ...: no such file or directory" and named no fix;
// it names the command that starts one on that data directory, or the
// flags that point at one that runs.
func TestNoStackNamesTheFix(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none")
	sock := filepath.Join(none, "daemon.sock")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"status", "--config-dir", none}, "no stack listens on " + sock + ": start one with `clawmesh up --config-dir " + none + "`"},
		{[]string{"config", "get", "--config-dir", none}, "`clawmesh up --config-dir " + none + "`"},
		// A socket named explicitly is a gateway's that up does not start
		// there (a container's, compose's): that gateway is named, not up.
		{[]string{"call", "status", "--socket", sock}, "no stack listens on " + sock + " (named by --socket): start the gateway that serves it"},
	} {
		_, stderr, code := runCLI(t, tc.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != 1 || !strings.Contains(last, tc.says) || !strings.Contains(last, "--socket") {
			t.Errorf("clawmesh %s: exit %d, last line %q (want %q and the flags that point at a running stack)", strings.Join(tc.args, " "), code, last, tc.says)
		}
	}
}
