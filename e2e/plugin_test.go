package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// echoTool is the tool name of plugins/examples/echo (the session's
// built-in "echo" would win a clash).
const echoTool = "wasm_echo"

// installPlugin builds plugins/examples/<name> and installs it under
// <dataDir>/plugins/<name>/ (plugin.wasm and manifest.toml), before the
// stack starts, with its compiled code in the data directory's
// compilation cache (e2e.SeedCompiled): the sandbox loads it as on any
// start after its first, where each stack compiled it anew.
func installPlugin(t *testing.T, dataDir, name string) {
	t.Helper()
	installPluginCold(t, dataDir, name)
	seedExamples(t, dataDir, name)
}

// seedExamples puts the compiled code of the named examples into the
// compilation cache of dataDir (e2e.SeedCompiled), for plugins installed
// there before or after the stack starts.
func seedExamples(t *testing.T, dataDir string, names ...string) {
	t.Helper()
	for _, name := range names {
		wasm, err := guestbuild.Wasm(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := e2e.SeedCompiled(dataDir, wasm); err != nil {
			t.Fatal(err)
		}
	}
}

// installPluginCold is installPlugin leaving the compilation cache empty:
// for a test of what the sandbox compiles.
func installPluginCold(t *testing.T, dataDir, name string) {
	t.Helper()
	if err := guestbuild.Install(filepath.Join(dataDir, "plugins"), name); err != nil {
		t.Fatal(err)
	}
}

// pluginStack starts a stack whose data directory has the given example
// plugins installed (installPlugin).
func pluginStack(t *testing.T, plugins []string, args ...string) *e2e.Stack {
	t.Helper()
	return pluginStackWith(t, installPlugin, plugins, args...)
}

// pluginStackCold is pluginStack on an empty compilation cache.
func pluginStackCold(t *testing.T, plugins []string, args ...string) *e2e.Stack {
	t.Helper()
	return pluginStackWith(t, installPluginCold, plugins, args...)
}

func pluginStackWith(t *testing.T, install func(*testing.T, string, string), plugins []string, args ...string) *e2e.Stack {
	t.Helper()
	dataDir := e2e.TempDataDir(t)
	for _, p := range plugins {
		install(t, dataDir, p)
	}
	return e2e.Start(t, e2e.Options{DataDir: dataDir, Args: args})
}

// pluginUpdate is a session/update with the tool result's status.
type pluginUpdate struct {
	update
	Status string `json:"status"`
}

// toolTurn runs one prompt and returns its tool_call and tool_result
// updates, in order, and every update, failing on a turn error.
func toolTurn(t *testing.T, v *conv, session, prompt string) (calls, results, all []pluginUpdate) {
	t.Helper()
	id := v.send("session/prompt", map[string]any{"session_id": session, "prompt": prompt})
	for {
		f := v.next()
		if f.Method == "session/update" {
			var u pluginUpdate
			if err := json.Unmarshal(f.Params, &u); err != nil {
				t.Fatalf("bad update %s: %v", f.Params, err)
			}
			all = append(all, u)
			switch u.Type {
			case "tool_call":
				calls = append(calls, u)
			case "tool_result":
				results = append(results, u)
			}
			continue
		}
		if f.Method == "" && string(f.ID) == id {
			if f.Error != nil {
				t.Fatalf("prompt %q: %v", prompt, f.Error)
			}
			return calls, results, all
		}
	}
}

// waitForPluginTool polls, with probe turns in a session of its own, until
// the session service reaches a sandbox that offers tool: the session
// service starts before the sandbox and reconnects with backoff.
func waitForPluginTool(t *testing.T, v *conv, tool string) {
	t.Helper()
	probe := v.newSession("")
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, results, _ := toolTurn(t, v, probe, "/tool "+tool+` {"msg":"ready?"}`)
		if len(results) == 1 && results[0].RawOutput == "ready?" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tool %s never served: %+v", tool, results)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A plugin tool in a turn, over the socket: the echo plugin serves
// /tool wasm_echo; a misbehaving plugin in the same stack (an infinite
// loop) is stopped by plugins.limits.call_timeout_ms set with --set, its turn goes on with
// a failed tool result, and the echo plugin still serves afterwards.
func TestPluginToolTurn(t *testing.T) {
	t.Parallel()
	// The fuel budget is raised so that the deadline is what stops the
	// loop: both values reach the sandbox through the config service.
	s := pluginStack(t, []string{"echo", "misbehave"},
		"--set", "plugins.limits.call_timeout_ms=300", "--set", "plugins.limits.call_fuel=1000000000000")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")

	calls, results, _ := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"hi"}`)
	if len(calls) != 1 || len(results) != 1 {
		t.Fatalf("tool_call then tool_result expected: %+v %+v", calls, results)
	}
	var in map[string]string
	if calls[0].Name != echoTool || json.Unmarshal(calls[0].RawInput, &in) != nil || in["msg"] != "hi" {
		t.Fatalf("tool_call %+v", calls[0])
	}
	if r := results[0]; r.ToolCallID != calls[0].ToolCallID || r.RawOutput != "hi" || r.Status != "completed" {
		t.Fatalf("tool_result %+v, want the plugin's output %q", r, "hi")
	}

	calls, results, ups := toolTurn(t, v, id, `/tool misbehave {"mode":"loop"}`+"\n/say carried on")
	if len(calls) != 1 || len(results) != 1 || results[0].Status != "failed" ||
		!strings.Contains(results[0].RawOutput, "call_timeout_ms 300") {
		sandboxLog, _ := os.ReadFile(filepath.Join(s.DataDir, "logs", "plugin-sandbox.log"))
		t.Fatalf("the looping plugin: %+v\nplugin-sandbox log:\n%s", results, sandboxLog)
	}
	var said strings.Builder
	for _, u := range ups {
		if u.Type == "agent_message_chunk" {
			said.WriteString(u.Text)
		}
	}
	if !strings.Contains(said.String(), "carried on") {
		t.Fatalf("the turn did not go on after the failed tool: %+v", ups)
	}

	_, results, _ = toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"still here"}`)
	if len(results) != 1 || results[0].RawOutput != "still here" || results[0].Status != "completed" {
		t.Fatalf("echo after the misbehaving plugin: %+v", results)
	}
}

// With two sandbox replicas, calls are spread over both and each serves
// the tool: every replica loads the same plugins from the same folder.
func TestPluginToolScaled(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"}, "--scale", "plugin-sandbox=2")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	logs := []string{
		filepath.Join(s.DataDir, "logs", "plugin-sandbox.log"),
		filepath.Join(s.DataDir, "logs", "plugin-sandbox.1.log"),
	}
	served := func(path string) int {
		raw, _ := os.ReadFile(path)
		n := 0
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, "tool executed") && strings.Contains(line, echoTool) {
				n++
			}
		}
		return n
	}
	// Two calls in one turn are consecutive picks of the round-robin
	// balancer; poll until both replicas are connected and have served.
	deadline := time.Now().Add(90 * time.Second)
	for n := 0; ; n++ {
		prompt := "/tool " + echoTool + ` {"msg":"a"}` + "\n/tool " + echoTool + ` {"msg":"b"}`
		_, results, _ := toolTurn(t, v, id, prompt)
		if len(results) != 2 || results[0].RawOutput != "a" || results[1].RawOutput != "b" {
			t.Fatalf("turn %d: %+v", n, results)
		}
		if served(logs[0]) > 0 && served(logs[1]) > 0 {
			t.Logf("replicas served %d and %d calls after %d turns", served(logs[0]), served(logs[1]), n+1)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every replica served a call: %d, %d", served(logs[0]), served(logs[1]))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A plugin's config and secret travel from the config service to the
// sandbox per call: the operator sets them over the socket, the tool reads
// the public part in __config and the secret through secrets.get, the
// secret never shows in __config, the turn's updates or the sandbox log,
// and a rotated secret is used on the next call without a restart.
func TestPluginConfigAndSecretFromTheConfigService(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"secretconfig"})
	v := newConv(t, s, nil)
	key := abi.InstanceKey("greeter", abi.WorldTool, "")
	const secret, rotated = "sk-e2e-0123456789", "sk-e2e-rotated-987"
	setConfig := func(apiKey string) {
		v.call("config/set", map[string]any{"prop": "plugins.entries." + key + ".config",
			"value": map[string]any{"greeting": "Hello", "retries": "2", "api_key": apiKey}})
	}
	setConfig(secret)
	id := v.newSession("")
	// The secret is never in the prompt either: the tool reports its length.
	greet := func() map[string]any {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			_, results, all := toolTurn(t, v, id, `/tool greeter {"who":"Ann"}`)
			for _, u := range all {
				raw, _ := json.Marshal(u)
				if strings.Contains(string(raw), secret) || strings.Contains(string(raw), rotated) {
					t.Fatalf("a secret in a session/update: %s", raw)
				}
			}
			if len(results) == 1 && results[0].Status == "completed" {
				var out map[string]any
				if err := json.Unmarshal([]byte(results[0].RawOutput), &out); err != nil {
					t.Fatalf("greeter output %q", results[0].RawOutput)
				}
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("greeter never served: %+v", results)
			}
			time.Sleep(200 * time.Millisecond) // the sandbox may still be starting
		}
	}
	out := greet()
	if out["greeting"] != "Hello, Ann" || out["retries"] != 2.0 || out["key_len"] != float64(len(secret)) {
		t.Fatalf("greeter saw %v", out)
	}
	if keys, _ := out["config_keys"].([]any); len(keys) != 2 || contains(toStrings(keys), "api_key") {
		t.Fatalf("__config keys %v: the secret must not be there", out["config_keys"])
	}
	setConfig(rotated)
	if out := greet(); out["key_len"] != float64(len(rotated)) {
		t.Fatalf("the rotated secret was not used on the next call: %v", out)
	}
	for _, proc := range []string{"plugin-sandbox", "config", "session", "gateway"} {
		if l := readLog(t, s, proc); strings.Contains(l, secret) || strings.Contains(l, rotated) {
			t.Fatalf("a secret in the %s log", proc)
		}
	}
	var got struct {
		Value map[string]any `json:"value"`
	}
	json.Unmarshal(v.call("config/get", map[string]any{"prop": "plugins.entries." + key + ".config"}), &got)
	if got.Value["api_key"] != "***MASKED***" {
		t.Fatalf("config/get shows %v", got.Value)
	}
}

func toStrings(vs []any) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

// The plugin sandbox keeps its compilation cache in its bound: an entry
// no one used for a day in a cache past 512 MiB (a plugin rebuilt many
// times, a wazero upgraded) is removed when the sandbox starts, and a
// temporary file a killed compile left with it; a recent entry stays.
func TestPluginSandboxTrimsItsCompilationCache(t *testing.T) {
	t.Parallel()
	dir := e2e.TempDataDir(t)
	cache := filepath.Join(dir, "wasm-cache", "wazero-0.0.1-amd64-linux")
	if err := os.MkdirAll(cache, 0o700); err != nil {
		t.Fatal(err)
	}
	day := time.Now().Add(-25 * time.Hour)
	plant := func(name string, size int64, when time.Time) string {
		t.Helper()
		path := filepath.Join(cache, name)
		f, err := os.Create(path)
		if err == nil {
			err = f.Truncate(size) // sparse: counted at its size, stored in nothing
		}
		if err == nil {
			err = f.Close()
		}
		if err == nil {
			err = os.Chtimes(path, when, when)
		}
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	stale := plant("0001", 600<<20, day)
	left := plant("0002.77.tmp", 1<<20, day)
	recent := plant("0003", 1<<20, time.Now().Add(-time.Minute))

	s := e2e.Start(t, e2e.Options{DataDir: dir})
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, path := range []string{stale, left} {
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				return fmt.Errorf("%s still in the cache (%v)", filepath.Base(path), err)
			}
		}
		return nil
	})
	if _, err := os.Stat(recent); err != nil {
		t.Fatalf("a recent entry: %v", err)
	}
	if s.PIDOf("plugin-sandbox") == 0 {
		t.Fatal("no plugin sandbox running")
	}
}

// A memory plugin keeps its entries in its instance, one per sandbox
// replica, and the replicas share its journal: before each memory call a
// replica gives its instance what another stored. With two replicas the
// session service spreads memory calls like tool calls, and a memory
// stored through one replica is there for a recall served by the other
// (once it was not, and memory calls went to one replica; since the
// sixty-first round they are spread again, the journal shared).
func TestMemoryPluginScaled(t *testing.T) {
	t.Parallel()
	s := pluginStackCold(t, []string{"echo", "kv"}, "--scale", "plugin-sandbox=2")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	served := func(path string) int {
		raw, _ := os.ReadFile(path)
		return strings.Count(string(raw), `"tool executed"`)
	}
	// Both replicas connected: each has served a tool call.
	deadline := time.Now().Add(90 * time.Second)
	for served(filepath.Join(s.DataDir, "logs", "plugin-sandbox.log")) == 0 || served(filepath.Join(s.DataDir, "logs", "plugin-sandbox.1.log")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("not every replica served a call")
		}
		toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"a"}`+"\n/tool "+echoTool+` {"msg":"b"}`)
	}
	// The replicas started together on an empty compilation cache: one
	// compiled each of the two modules, the other waited and loaded it
	// (each compiled both, at once, and a busy machine's start failed).
	logged := func(msg string) (n int) {
		for _, name := range []string{"plugin-sandbox.log", "plugin-sandbox.1.log"} {
			raw, _ := os.ReadFile(filepath.Join(s.DataDir, "logs", name))
			n += strings.Count(string(raw), `"msg":"`+msg+`"`)
		}
		return n
	}
	if c, l := logged("plugin compiled"), logged("plugin loaded from the compilation cache"); c != 2 || l < 2 {
		t.Fatalf("two replicas, two modules: %d compiles, %d loads from the cache; want 2 and at least 2", c, l)
	}
	_, results, _ := toolTurn(t, v, id, `/tool plugin_memory_store {"key":"sky","content":"the sky is blue"}`)
	if len(results) != 1 || results[0].Status != "completed" {
		t.Fatalf("store: %+v", results)
	}
	prompt := strings.Repeat(`/tool plugin_memory_recall {"query":"blue"}`+"\n", 6)
	_, results, _ = toolTurn(t, v, id, prompt)
	if len(results) != 6 {
		t.Fatalf("recalls: %+v", results)
	}
	for i, r := range results {
		if r.Status != "completed" || !strings.Contains(r.RawOutput, `"key":"sky"`) {
			t.Fatalf("recall %d of 6 did not find the memory: %+v", i+1, r)
		}
	}
}

// A stack whose plugins the test installed (installPlugin) loads them
// from its compilation cache, seeded with what the sandbox's host
// compiles: each stack's sandbox compiled each of its modules itself
// before, about two seconds of CPU a module, in some thirty stacks of the
// package. The seeded entry must be the one the stack's own sandbox
// looks for (the same wazero version, the same prepared module), or it
// compiles anyway and the seeding only costs a copy.
func TestInstalledPluginsLoadFromASeededCache(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo", "kv"})
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	raw, err := os.ReadFile(filepath.Join(s.DataDir, "logs", "plugin-sandbox.log"))
	if err != nil {
		t.Fatal(err)
	}
	log := string(raw)
	if c, l := strings.Count(log, `"msg":"plugin compiled"`), strings.Count(log, `"msg":"plugin loaded from the compilation cache"`); c != 0 || l < 2 {
		t.Fatalf("two seeded modules: %d compiled, %d loaded from the cache; want 0 and at least 2", c, l)
	}
}

// A memory plugin keeps its entries in its instance: a plugin sandbox
// killed and restarted by the launcher came back with none. Its journal
// under the data directory now gives them back.
func TestMemoriesOutliveASandboxKill(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo", "kv"})
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	_, results, _ := toolTurn(t, v, id, `/tool plugin_memory_store {"key":"sky","content":"the sky is blue"}`)
	if len(results) != 1 || results[0].Status != "completed" {
		t.Fatalf("store: %+v", results)
	}
	victim := replicaPID(t, s, 0)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, 0, victim); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, results, _ = toolTurn(t, v, id, `/tool plugin_memory_recall {"query":"blue"}`)
		if len(results) == 1 && results[0].Status == "completed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recall after the restart: %+v", results)
		}
		time.Sleep(200 * time.Millisecond) // the sandbox is still starting
	}
	if !strings.Contains(results[0].RawOutput, `"key":"sky"`) {
		t.Fatalf("the memory did not outlive the kill: %s", results[0].RawOutput)
	}
}
