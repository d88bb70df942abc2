package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/jsonexact"
)

// clawmesh up --set and clawmesh config set read values with the schema
// (configschema.ParseText), exactly: 2^53+1 is refused naming the
// property before anything is sent, 2^53 is the limit.
func TestSetReadsIntegersExactly(t *testing.T) {
	_, err := configschema.ParseText("plugins.limits.call_fuel", "9007199254740993")
	if !errors.Is(err, jsonexact.ErrInexact) || !strings.HasPrefix(err.Error(), "`plugins.limits.call_fuel`:") {
		t.Fatalf("2^53+1: %v", err)
	}
	v, err := configschema.ParseText("plugins.limits.call_fuel", "9007199254740992")
	if err != nil || v != int64(1<<53) {
		t.Fatalf("2^53: %v %v", v, err)
	}
	err = configCmd([]string{"set", "plugins.limits.call_fuel=9007199254740993", "--socket", "/nonexistent/socket"}, io.Discard)
	if !errors.Is(err, jsonexact.ErrInexact) || !strings.Contains(err.Error(), "plugins.limits.call_fuel") {
		t.Fatalf("clawmesh config set 2^53+1: %v", err)
	}
}

// --set-file was read whole, however large: a file named by mistake (a
// log of gigabytes, /dev/zero) filled the launcher's memory before any
// line was looked at. Past what the overrides may be, with room for
// comments, it is refused naming the bound.
func TestSetFileIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sets")
	body := "agents.default.model=m\n" + strings.Repeat("# a comment line\n", maxSetFileBytes/17+1)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readSetFile(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a --set-file of %d bytes: %v", len(body), err)
	}
	if err := os.WriteFile(path, []byte("# ok\nagents.default.model=m\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if sets, err := readSetFile(path); err != nil || len(sets) != 1 || sets[0] != "agents.default.model=m" {
		t.Fatalf("a small --set-file: %q %v", sets, err)
	}
}

// `config get A B` printed A alone and `config list P Q` listed under P
// alone, the rest dropped without a word: the operator took B's silence
// for an answer. More than one PROP or PREFIX is refused before the
// stack is asked.
func TestConfigReadsTakeOneArgument(t *testing.T) {
	for _, args := range [][]string{
		{"get", "agents.default.model", "agents.default.provider"},
		{"list", "rpc", "agents"},
		{"schema", "rpc", "agents"},
	} {
		err := configCmd(append(args, "--socket", "/nonexistent/socket"), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "want at most one") {
			t.Errorf("config %q: %v", args, err)
		}
	}
}

// The CLI printed what the daemon's JSON escapes as such: a system
// prompt "Use <b> & co" read "Use \u003cb\u003e \u0026 co", which is not
// what the operator had set. It prints the characters.
func TestConfigPrintsTextAsIs(t *testing.T) {
	for cmd, res := range map[string]string{
		"get":  `{"prop":"p","value":"Use \u003cb\u003e \u0026 co"}`,
		"list": `{"entries":[{"prop":"agents.default.system_prompt","value":"Use \u003cb\u003e \u0026 co"}]}`,
	} {
		var out strings.Builder
		if err := printResult(&out, cmd, json.RawMessage(res)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), `"Use <b> & co"`) {
			t.Errorf("config %s printed %q", cmd, out.String())
		}
	}
}

// A --set-file line is trimmed at its ends, and was not around its "=":
// "agents.default.model = gpt-4o", as a config file is often written,
// set the model " gpt-4o", which the provider then did not know. Spaces
// around "=" are dropped; a JSON string keeps spaces on purpose.
func TestSetFileSpacesAroundEquals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sets")
	body := "agents.default.model = gpt-4o\n  agents.default.system_prompt=\"  two spaces\"  \n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sets, err := readSetFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"agents.default.model=gpt-4o", `agents.default.system_prompt="  two spaces"`}
	if !slices.Equal(sets, want) {
		t.Fatalf("read %q, want %q", sets, want)
	}
	if v, err := configschema.ParseText("agents.default.system_prompt", strings.SplitN(sets[1], "=", 2)[1]); err != nil || v != "  two spaces" {
		t.Fatalf("quoted value: %q %v", v, err)
	}
}

// `clawmesh token` printed gRPC's framing: with no stack running,
// "rpc error: code = Unavailable desc = connection error: desc =
// \"transport: Error while dialing: ...\"". It says what is wrong, as
// `clawmesh config` does.
func TestTokenWithoutAStackSaysSo(t *testing.T) {
	err := tokenCmd([]string{"create", "--user", "alice", "--config-dir", t.TempDir()}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "is the stack running?") || strings.Contains(err.Error(), "rpc error") {
		t.Fatalf("token create without a stack: %v", err)
	}
}
