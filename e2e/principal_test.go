package e2e_test

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// A token user sees only its own sessions in status (it counts them all)
// and initialize lists only the methods its permissions allow; config
// refusals name the allowed values and list indexes; a write of a
// property read only at start says it needs a restart.
func TestPrincipalViewAndConfigThatExplainsItself(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := s.Dial(t)
	init, err := op.Initialize()
	if err != nil {
		t.Fatal(err)
	}
	opCaps := strings.Join(anyStrings(init["capabilities"]), " ")
	for _, m := range []string{"session/new", "config/set", "config/get", "status", "health"} {
		if !strings.Contains(opCaps, m) {
			t.Fatalf("the operator's capabilities lack %s: %s", m, opCaps)
		}
	}
	opSession := call(t, op, "session/new", map[string]any{"agent_alias": "default"})["session_id"].(string)

	call(t, op, "config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "permission_profiles.chatter.agents", "value": []string{"default"}},
		{"prop": "users.alice.permission_profiles", "value": []string{"chatter"}},
	}})
	alice := s.Dial(t)
	init, err = alice.Initialize(userToken(t, s, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	caps := anyStrings(init["capabilities"])
	if !slices.Contains(caps, "session/prompt") || slices.Contains(caps, "config/set") || slices.Contains(caps, "config/get") {
		t.Fatalf("alice's capabilities: %v", caps)
	}
	mine := call(t, alice, "session/new", map[string]any{"agent_alias": "default"})["session_id"].(string)
	st := call(t, alice, "status", nil)
	if got := anyStrings(st["session_ids"]); !reflect.DeepEqual(got, []string{mine}) || st["active_sessions"] != 2.0 {
		t.Fatalf("alice's status lists %v of %v sessions", got, st["active_sessions"])
	}
	st = call(t, op, "status", nil)
	if got := anyStrings(st["session_ids"]); len(got) != 2 || !slices.Contains(got, opSession) || !slices.Contains(got, mine) {
		t.Fatalf("the operator's status lists %v", got)
	}

	// Enumerations name their values; list items their index.
	_, err = op.Call("config/set", map[string]any{"prop": "agents.gpt.provider", "value": "opneai"})
	if !isCode(err, -32602) || !strings.Contains(err.Error(), "must be one of scripted, openai") {
		t.Fatalf("provider typo: %v", err)
	}
	_, err = op.Call("config/set", map[string]any{"prop": "permission_profiles.p.permissions", "value": []string{"agent:use", "Config:Raed"}})
	if !isCode(err, -32602) || !strings.Contains(err.Error(), "item 1") || !strings.Contains(err.Error(), "Config:Read") {
		t.Fatalf("permission typo: %v", err)
	}
	// A property read at start says so; one read live does not.
	if got := call(t, op, "config/set", map[string]any{"prop": "rpc.max_local_connections", "value": 100}); !reflect.DeepEqual(got["requires_restart"], []any{"rpc.max_local_connections"}) {
		t.Fatalf("restart-only property: %v", got)
	}
	if got := call(t, op, "config/set", map[string]any{"prop": "agents.default.model", "value": "m"}); got["requires_restart"] != nil {
		t.Fatalf("live property: %v", got)
	}
	cmd := exec.Command(filepath.Join(s.BinDir, "clawmesh"), "config", "set", "rpc.frame_timeout_ms=20000", "--socket", s.Socket)
	raw, err := cmd.CombinedOutput()
	if out := string(raw); err != nil || !strings.Contains(out, "note: rpc.frame_timeout_ms take(s) effect when the stack restarts") {
		t.Fatalf("CLI restart note: %v\n%s", err, out)
	}
	// The CLI refuses with the schema's words, naming the index.
	out, err := clawmesh(t, s, "config", "set", "permission_profiles.p.permissions=agent:use,bogus")
	if err == nil || !strings.Contains(out, "item 1") {
		t.Fatalf("CLI list item: %v\n%s", err, out)
	}
}

func anyStrings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
