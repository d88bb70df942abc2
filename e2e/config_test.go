package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// rpcData decodes an error's data.
func rpcData(t *testing.T, err error) map[string]any {
	t.Helper()
	var re *e2e.RPCError
	if !errors.As(err, &re) {
		t.Fatalf("not an rpc error: %v", err)
	}
	var d map[string]any
	if len(re.Data) > 0 {
		if err := json.Unmarshal(re.Data, &d); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func call(t *testing.T, c *e2e.Client, method string, params any) map[string]any {
	t.Helper()
	raw, err := c.Call(method, params)
	if err != nil {
		t.Fatalf("%s %v: %v", method, params, err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// clawmesh runs the CLI of the stack's build.
func clawmesh(t *testing.T, s *e2e.Stack, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.BinDir, "clawmesh"), args...)
	cmd.Env = append(os.Environ(), "ZEROCLAW_SOCKET="+s.Socket, "ZEROCLAW_CONFIG_DIR="+s.DataDir, "ZEROCLAW_TOKEN=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String() + errOut.String(), err
	}
	return out.String(), nil
}

// The config methods over the socket, for the operator and for a
// token-bound scoped user, and the CLI against the running stack.
func TestConfigOverTheSocket(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := s.Dial(t)
	init, err := op.Initialize()
	if err != nil {
		t.Fatal(err)
	}
	caps, _ := init["capabilities"].([]any)
	for _, m := range []string{"config/get", "config/set", "config/set-many", "config/list", "config/delete"} {
		if !containsAny(caps, m) {
			t.Fatalf("capabilities %v lack %s", caps, m)
		}
	}

	// The seed's example: a profile named operator, then a whole user in
	// one request.
	if got := call(t, op, "config/set", map[string]any{"prop": "permission_profiles.operator.permissions", "value": []string{"admin"}}); !reflect.DeepEqual(got, map[string]any{"prop": "permission_profiles.operator.permissions", "set": true}) {
		t.Fatalf("config/set result %v", got)
	}
	raw, err := op.Call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "users.example.uid", "value": 1001},
		{"prop": "users.example.permission_profiles", "value": []string{"operator"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"props":["users.example.uid","users.example.permission_profiles"],"set":true}` {
		t.Fatalf("set-many result %s", raw)
	}
	if got := call(t, op, "config/get", map[string]any{"prop": "users.example"}); !reflect.DeepEqual(got["value"], map[string]any{"uid": 1001.0, "permission_profiles": []any{"operator"}}) {
		t.Fatalf("config/get users.example: %v", got)
	}
	// Defaults are there out of the box, secrets are masked.
	if got := call(t, op, "config/get", map[string]any{"prop": "agents.default.provider"}); got["value"] != "scripted" {
		t.Fatalf("default agent: %v", got)
	}
	call(t, op, "config/set", map[string]any{"prop": "agents.default.api_key", "value": "sk-e2e-secret"})
	if got := call(t, op, "config/get", map[string]any{"prop": "agents.default.api_key"}); got["value"] != "***MASKED***" {
		t.Fatalf("api_key read as %v", got)
	}

	// Refusals name the field or the entry.
	_, err = op.Call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "agents.default.model", "value": "a"},
		{"prop": "agents.default.model", "value": "b"},
		{"prop": "agents.default.model", "value": "c"},
		{"prop": "rpc.max_local_connections", "value": "lots"},
	}})
	if d := rpcData(t, err); !isCode(err, -32602) || d["index"] != 3.0 || d["reason"] != "invalid" || !strings.Contains(err.Error(), "sets[3]") {
		t.Fatalf("type error at index 3: %v %v", err, d)
	}
	if _, err := op.Call("config/set-many", map[string]any{"sets": []any{}}); !isCode(err, -32602) || !strings.Contains(err.Error(), "1 to 256") {
		t.Fatalf("empty batch: %v", err)
	}
	if _, err := op.Call("config/set-many", map[string]any{"sets": []any{map[string]any{"prop": "agents.default.model", "value": "x"}, map[string]any{"value": 1}}}); !isCode(err, -32602) || rpcData(t, err)["index"] != 1.0 {
		t.Fatalf("entry without prop: %v", err)
	}
	if _, err := op.Call("config/set", map[string]any{"prop": "agents.default.model"}); !isCode(err, -32602) || !strings.Contains(err.Error(), "`value`") {
		t.Fatalf("set without value: %v", err)
	}
	if got := call(t, op, "config/get", map[string]any{"prop": "agents.default.model"}); got["value"] != "" {
		t.Fatalf("a refused batch changed the model: %v", got)
	}

	// A scoped user, paired with a token by the CLI.
	call(t, op, "config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "permission_profiles.editor.permissions", "value": []string{"Config:Update"}},
		{"prop": "permission_profiles.editor.config_paths", "value": []string{"agents.*.model", "agents.*.system_prompt"}},
		{"prop": "users.alice.permission_profiles", "value": []string{"editor"}},
	}})
	token := userToken(t, s, "alice")

	unpaired := s.Dial(t)
	if _, err := unpaired.Call("initialize", map[string]any{"protocol_version": 1, "auth_token": token + "x"}); !isCode(err, -32010) {
		t.Fatalf("unpaired token: %v", err)
	}
	if _, err := unpaired.Call("config/get", map[string]any{}); !isCode(err, -32010) {
		t.Fatalf("an unpaired token must bind nothing: %v", err)
	}

	alice := s.Dial(t)
	ai := call(t, alice, "initialize", map[string]any{"protocol_version": 1, "auth_token": token})
	if ai["principal_id"] != "user:alice" {
		t.Fatalf("token-bound principal %v", ai["principal_id"])
	}
	call(t, alice, "config/set", map[string]any{"prop": "agents.default.model", "value": "m1"})
	raw, err = alice.Call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "agents.default.model", "value": "m2"},
		{"prop": "agents.default.system_prompt", "value": "p2"},
		{"prop": "rpc.max_frame_bytes", "value": 1 << 20},
	}})
	if d := rpcData(t, err); !isCode(err, -32012) || d["reason"] != "forbidden" || d["index"] != 2.0 {
		t.Fatalf("forbidden path at index 2: %s %v %v", raw, err, d)
	}
	if got := call(t, alice, "config/get", map[string]any{"prop": "agents.default.model"}); got["value"] != "m1" {
		t.Fatalf("model after the forbidden batch: %v", got)
	}
	if _, err := alice.Call("config/get", map[string]any{"prop": "users"}); !isCode(err, -32012) {
		t.Fatalf("alice reads users: %v", err)
	}
	list := call(t, alice, "config/list", map[string]any{})
	for _, e := range list["entries"].([]any) {
		if p := e.(map[string]any)["prop"].(string); !strings.HasSuffix(p, ".model") && !strings.HasSuffix(p, ".system_prompt") {
			t.Fatalf("alice lists %s", p)
		}
	}

	// The CLI: the operator sets several props at once and reads them;
	// alice's token gets the same refusal as on the socket.
	if out, err := clawmesh(t, s, "config", "set", "agents.default.system_prompt=be brief", "agents.default.tools=echo,shell"); err != nil {
		t.Fatalf("config set: %v\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "config", "get", "agents.default.system_prompt"); err != nil || strings.TrimSpace(out) != `"be brief"` {
		t.Fatalf("config get: %q %v", out, err)
	}
	out, err := clawmesh(t, s, "config", "list", "agents.default.")
	if err != nil || !strings.Contains(out, `agents.default.api_key = "***MASKED***"`) || !strings.Contains(out, `agents.default.tools = ["echo","shell"]`) {
		t.Fatalf("config list: %v\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "config", "set", "--token", token, "rpc.max_frame_bytes=65536"); err == nil || !strings.Contains(out, "-32012") {
		t.Fatalf("alice's CLI set of rpc.*: %v\n%s", err, out)
	}

	// Revoking the token stops the bound connection's writes at once.
	if out, err := clawmesh(t, s, "token", "revoke", "--user", "alice"); err != nil {
		t.Fatalf("token revoke: %v\n%s", err, out)
	}
	if _, err := alice.Call("config/set", map[string]any{"prop": "agents.default.model", "value": "m3"}); !isCode(err, -32012) {
		t.Fatalf("write after revocation: %v", err)
	}
}

func containsAny(list []any, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// The launcher's --set overrides are committed when the stack starts.
// The launcher gave them to every run of the config service, so one
// restarted after a crash committed them again: a config/set made since
// was undone without a word.
func TestStartupSetsNotReappliedOnAConfigRestart(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", "agents.default.model=from-start"}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	call(t, c, "config/set", map[string]any{"prop": "agents.default.model", "value": "set-since"})
	pid := s.PIDOf("config")
	if pid == 0 {
		t.Fatalf("no config process among %v", s.PIDs())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if p := s.PIDOf("config"); p == 0 || p == pid {
			return errors.New("config not restarted yet")
		}
		_, err := c.Call("config/get", map[string]any{"prop": "agents.default.model"})
		return err
	})
	if got := call(t, c, "config/get", map[string]any{"prop": "agents.default.model"}); got["value"] != "set-since" {
		t.Fatalf("agents.default.model after the config service restarted: %v, want set-since", got["value"])
	}
}
