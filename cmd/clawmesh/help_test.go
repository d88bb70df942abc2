package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// asMain makes this test binary run clawmesh's main when re-executed with
// it set (see runCLI).
const asMain = "CLAWMESH_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runCLI runs clawmesh with args in a process of its own and returns its
// output and exit status.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asMain+"=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errOut.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), 0
}

// Every command and subcommand answers -h with its usage on stdout and
// exit status 0, never "flag: help requested".
func TestEveryCommandAnswersHelp(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"up", "-h"}, {"daemon", "--help"}, {"chat", "-h"}, {"call", "-h"}, {"status", "-h"}, {"doctor", "-h"},
		{"config", "-h"}, {"config", "get", "-h"}, {"config", "set", "-h"},
		{"token", "-h"}, {"token", "create", "-h"}, {"token", "revoke", "-h"},
		{"plugin", "-h"}, {"plugin", "install", "-h"}, {"plugin", "list", "-h"},
		{"spool", "-h"}, {"spool", "list", "-h"}, {"spool", "drop", "-h"},
		{"health", "-h"}, {"bus", "-h"}, {"bus", "init", "-h"},
	} {
		stdout, stderr, code := runCLI(t, args...)
		if code != 0 || !strings.HasPrefix(stdout, "usage: clawmesh") || strings.Contains(stdout+stderr, "help requested") {
			t.Errorf("clawmesh %s: exit %d\nstdout: %.200s\nstderr: %.200s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
}

// An unknown subcommand is refused, -h or not: no usage of a command that
// does not exist, no exit 0.
func TestUnknownSubcommandRefusedEvenWithHelp(t *testing.T) {
	for _, args := range [][]string{{"config", "bogus", "-h"}, {"plugin", "bogus", "-h"}, {"bus", "bogus", "-h"}, {"token", "bogus", "-h"}, {"spool", "bogus", "-h"}} {
		_, stderr, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(stderr, "bogus") && !strings.Contains(stderr, "want create or revoke") {
			t.Errorf("clawmesh %s: exit %d, stderr %.200s", strings.Join(args, " "), code, stderr)
		}
	}
}

// The layouts of README.md and docs/design.md name every command of the
// CLI on their cmd/clawmesh/ line: they listed seven of the eleven
// (status, doctor, health and bus were missing).
func TestLayoutsNameEveryCommand(t *testing.T) {
	for _, doc := range []string{"../../README.md", "../../docs/design.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		var line string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "cmd/clawmesh/ ") {
				line = l
			}
		}
		if line == "" {
			t.Fatalf("%s has no cmd/clawmesh/ line in its layout", doc)
		}
		_, named, _ := strings.Cut(line, "the CLI:")
		words := strings.FieldsFunc(named, func(r rune) bool { return r == ',' || r == '/' || r == ' ' })
		for _, c := range commands {
			if !slices.Contains(words, c) {
				t.Errorf("%s's layout line %q does not name %s", doc, line, c)
			}
		}
	}
}

// A command's usage line names every flag its -h lists below it: up's
// left out --bin-dir and --log-level, doctor's --token.
func TestUsageLinesNameEveryFlag(t *testing.T) {
	for _, cmd := range []string{"up", "call", "status", "chat", "doctor"} {
		out, _, code := runCLI(t, cmd, "-h")
		if code != 0 {
			t.Fatalf("clawmesh %s -h: exit %d", cmd, code)
		}
		head, flags, ok := strings.Cut(out, "\nflags:\n")
		if !ok {
			t.Fatalf("clawmesh %s -h has no flags section:\n%s", cmd, out)
		}
		usage, _, _ := strings.Cut(head, "\n\n")
		for _, l := range strings.Split(flags, "\n") {
			if f, ok := strings.CutPrefix(l, "  -"); ok {
				name, _, _ := strings.Cut(f, " ")
				if !strings.Contains(usage, "--"+name+" ") && !strings.Contains(usage, "--"+name+"]") {
					t.Errorf("clawmesh %s: usage %q does not name --%s", cmd, usage, name)
				}
			}
		}
	}
}

// A subcommand's -h gives what it takes and does, as its command's usage
// lists it: `config set -h` printed "usage: clawmesh config set [flags]"
// and its flags, without PROP=VALUE; `plugin remove -h` without NAME.
func TestSubcommandHelpSaysWhatItTakes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		head string
		says string
	}{
		{[]string{"config", "set", "-h"}, "usage: clawmesh config set PROP=VALUE ... [flags]\n", "set properties; several are one atomic config/set-many"},
		{[]string{"config", "get", "--help"}, "usage: clawmesh config get [PROP] [flags]\n", "print a property"},
		{[]string{"config", "delete", "-h"}, "usage: clawmesh config delete PROP [flags]\n", "return a property to its default"},
		{[]string{"plugin", "remove", "-h"}, "usage: clawmesh plugin remove NAME [flags]\n", "uninstall (--purge also deletes plugins.entries.<key>\nand the plugin's memory journal"},
		{[]string{"plugin", "install", "-h"}, "usage: clawmesh plugin install SOURCE [flags]\n", "(SOURCE is a path only when"},
		{[]string{"plugin", "sign", "-h"}, "usage: clawmesh plugin sign --key FILE PATH [flags]\n", "sign PATH"},
		{[]string{"token", "create", "-h"}, "usage: clawmesh token create [flags]\n", "pair a new token with users.NAME"},
	} {
		stdout, _, code := runCLI(t, tc.args...)
		if code != 0 || !strings.HasPrefix(stdout, tc.head) || !strings.Contains(stdout, tc.says) || !strings.Contains(stdout, "\nflags:\n") {
			t.Errorf("clawmesh %s: exit %d, stdout:\n%s\nwant it to start %q and say %q, then the flags", strings.Join(tc.args, " "), code, stdout, tc.head, tc.says)
		}
	}
}

// A plugin subcommand takes only its own flags: every one took all of
// them and ignored those not its own, so `plugin list --purge` and
// `plugin keygen --out F --registry URL` ran and exited 0 as if the
// flag meant something, and each -h listed twelve flags, most of them
// another subcommand's.
func TestPluginSubcommandsTakeOnlyTheirFlags(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "k")
	for _, tc := range [][]string{
		{"plugin", "list", "--purge", "--config-dir", dir},
		{"plugin", "keygen", "--out", key, "--registry", "http://127.0.0.1:1/"},
		{"plugin", "search", "q", "--out", key},
		{"plugin", "info", "echo", "--all", "--config-dir", dir},
		{"plugin", "sign", "--key", key, "--purge", dir},
	} {
		_, stderr, code := runCLI(t, tc...)
		if code != 2 || !strings.Contains(stderr, "flag provided but not defined") {
			t.Errorf("clawmesh %s: exit %d, stderr %q; want the flag refused (exit 2)", strings.Join(tc, " "), code, stderr)
		}
	}
	if _, err := os.Stat(key); err == nil {
		t.Error("keygen wrote a key despite a flag not its own")
	}
	stdout, _, _ := runCLI(t, "plugin", "keygen", "-h")
	if !strings.Contains(stdout, "-out") || strings.Contains(stdout, "-purge") || strings.Contains(stdout, "-registry") {
		t.Errorf("plugin keygen -h lists flags not its own:\n%s", stdout)
	}
}
