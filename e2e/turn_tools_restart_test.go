package e2e_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
)

// A turn lists the plugin tools at its start. The listing did not wait
// for a sandbox that did not serve (WaitForReady(false)), so a prompt
// sent while the launcher restarted a crashed sandbox (its socket away
// 0.2 to 1.8 s) ran a turn without the plugins' tools, silently: here
// its call of the echo plugin's tool was "Unknown tool". The listing
// now waits for the restarted sandbox within its bound, and the turn
// has the tool.
//
// The bound (3 s, docs/spec.md) is what is promised, not that a restart
// fits in it: the restart's own time (the new process's start, its bus
// and config, the plugin's load) is CPU the machine may not give, 0.3 s
// quiet and over 2.5 s at a load of 30, after a backoff of up to 800 ms
// here. A restart that outlasts the bound leaves the turn without the
// tool, told first that the sandbox did not serve in time; any other
// outcome fails. So does a run in which no turn of the four had the
// tool: each told the notice, it passed without ever showing that a
// turn waits for the restart (the first restart, after 100 ms of
// backoff, served within the bound in every run measured, at loads up
// to 28). The times from the kill to the prompt's answer, and to the
// restarted sandbox's serving, are logged.
func TestATurnStartedWhileTheSandboxRestartsHasItsPluginTools(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"})
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	// Four crashes in a row, each as soon as the last restart served:
	// the launcher's backoff doubles from 100 to 800 ms.
	outlasted, served := 0, 0
	for i := range 4 {
		killReplica(t, s, 0)
		start := time.Now()
		_, results, all := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"back"}`)
		took := time.Since(start)
		n := pluginNotices(all)
		if len(results) == 1 && results[0].Status == "completed" && results[0].RawOutput == "back" {
			if len(n) != 0 {
				t.Fatalf("restart %d: a turn that had its plugin tools was told otherwise: %q", i+1, n)
			}
			t.Logf("restart %d: the prompt sent once the sandbox was killed answered after %v, with the tool", i+1, took.Round(time.Millisecond))
			served++
			continue
		}
		if len(results) != 1 || results[0].Status != "failed" || !strings.HasPrefix(results[0].RawOutput, "Unknown tool") ||
			len(n) != 1 || all[0].Type != "agent_thought_chunk" || !restartOutlasted(n[0]) {
			t.Fatalf("restart %d: a turn started while the sandbox restarted: %+v", i+1, all)
		}
		// The next crash is made on a sandbox that serves, as the others.
		waitForPluginTool(t, v, echoTool)
		outlasted++
		t.Logf("restart %d: the restart outlasted the listing's bound: answered after %v, told %q; the sandbox served %v after the prompt",
			i+1, took.Round(time.Millisecond), n[0], servedAt(t, s, replicaPID(t, s, 0)).Sub(start).Round(time.Millisecond))
	}
	raw, _ := os.ReadFile(filepath.Join(s.DataDir, "logs", "session.log"))
	var again []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, "list plugin tools: tried again") {
			again = append(again, l)
		}
	}
	t.Logf("restarts that outlasted the listing's bound: %d of 4; listings tried again after a call on a broken connection: %d %q", outlasted, len(again), again)
	if served == 0 {
		t.Errorf("no turn of the four had the plugin's tool: each restart outlasted the listing's bound, so the test showed no turn waiting for one")
	}
}

// restartOutlasted reports whether notice says a turn's listing waited
// for the restarting sandbox as long as it may: its bound (3 s), or the
// grace after which a socket away counts as gone (grpcclient.RestartGrace,
// from the first connect that failed). Not "it is unavailable", which
// is a listing that did not wait.
func restartOutlasted(notice string) bool {
	const head = "[No plugin tools in this turn: the plugin sandbox could not list them: "
	return notice == head+"it is starting or restarting and did not serve within 3s.]" ||
		notice == head+"it cannot be reached (no replica is reachable).]"
}

// servedAt is when the sandbox process pid said it served, from its log.
func servedAt(t *testing.T, s *e2e.Stack, pid int) time.Time {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(s.DataDir, "logs", "plugin-sandbox.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		var e struct {
			Msg string    `json:"msg"`
			PID int       `json:"pid"`
			TS  time.Time `json:"ts"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "serving" && e.PID == pid {
			return e.TS
		}
	}
	t.Fatalf("plugin-sandbox %d never said it served", pid)
	return time.Time{}
}

// With the sandbox gone for good (killed, its binary taken away, so no
// restart the launcher tries comes up), a turn runs without the plugin
// tools, as before, but its client is told so: the turn's first update
// is a thought chunk saying that the plugin tools are unavailable and
// why. A prompt sent at once waits for the listing's bound at most
// (the sandbox may be restarting); once no replica has connected for
// grpcclient.RestartGrace, the listing fails at once. No timing is
// asserted; both waits are logged.
func TestATurnWithTheSandboxGoneIsToldItHasNoPluginTools(t *testing.T) {
	t.Parallel()
	bin := linkedBinDir(t)
	s := pluginStack(t, []string{"echo"}, "--bin-dir", bin)
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")

	if err := os.Remove(filepath.Join(bin, "plugin-sandbox")); err != nil {
		t.Fatal(err)
	}
	killReplica(t, s, 0)
	turn := func(when string) {
		t.Helper()
		start := time.Now()
		_, results, all := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"gone"}`+"\n/say end")
		took := time.Since(start)
		if len(results) != 1 || results[0].Status != "failed" || !strings.HasPrefix(results[0].RawOutput, "Unknown tool") {
			t.Fatalf("%s: the plugin's tool in a turn with the sandbox gone: %+v", when, all)
		}
		n := pluginNotices(all)
		if len(n) != 1 || all[0].Type != "agent_thought_chunk" || !strings.Contains(n[0], "plugin sandbox") {
			t.Fatalf("%s: the turn was not told, first, that it had no plugin tools: %+v", when, all)
		}
		t.Logf("%s: answered after %v; told %q", when, took.Round(time.Millisecond), n[0])
	}
	turn("at once")

	// Once plugins/list says no replica is reachable, the grace has
	// passed: the listing fails at once.
	waitFor(t, "plugins/list to say no replica is reachable", 60*time.Second, func() bool {
		_, err := v.c.Call("plugins/list", map[string]any{})
		var re *rpcclient.RPCError
		return errors.As(err, &re) && strings.HasPrefix(re.Message, "plugin-sandbox: no replica is reachable (")
	})
	turn("after the grace")
}

// pluginNotices are the texts of the updates that say a turn has no
// plugin tools.
func pluginNotices(all []pluginUpdate) []string {
	var out []string
	for _, u := range all {
		if u.Type == "agent_thought_chunk" && strings.Contains(u.Text, "plugin tools") {
			out = append(out, u.Text)
		}
	}
	return out
}
