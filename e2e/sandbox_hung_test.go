package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// hungBound stops a test whose call waits on a hung sandbox: under a
// tool call's two minutes (session.Config.ToolTimeout), so that a call
// that waited out its deadline fails the test by this bound, not by
// the deadline's own words.
const hungBound = 90 * time.Second

// A plugin sandbox that hangs (SIGSTOP: its socket still accepts in the
// kernel's backlog, nothing answers), kept stopped (the launcher's
// liveness limit set past the test). A turn asked before the stop calls
// a plugin tool and a memory tool after it: each ends with a failed
// result saying the sandbox is unavailable, once a health check on the
// session's connection to it goes unanswered (grpcclient.ProbeTimeout;
// it was the connection's keepalive and RestartGrace), not at the tool
// call's deadline.
// plugins/list, the first on this stack (its client finds the hang by
// connecting), fails before its own 5 s deadline saying no replica is reachable (it waited its 5 s, then
// said "starting: no replica serves yet", which a hung sandbox is
// not). Health says the sandbox is unreachable, `clawmesh status`
// names it; after SIGCONT every call is answered again.
func TestAHungSandboxFailsItsCallsAndHealthSaysSo(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo", "kv"}, "--liveness-timeout", "10m",
		"--set", `agents.default.approval_required=["wasm_echo","plugin_memory_recall"]`,
		"--set", "agents.default.approval_timeout_secs=3600")
	v := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	id := v.newSession("")
	testenv.Eventually(t, 90*time.Second, 200*time.Millisecond, func() error {
		rs := approvedTurn(t, v, id, `/tool `+echoTool+` {"msg":"ready?"}`, nil)
		if len(rs) != 1 || rs[0].RawOutput != "ready?" {
			return fmt.Errorf("the echo tool does not serve yet: %+v", rs)
		}
		return nil
	})
	if rs := approvedTurn(t, v, id, `/tool plugin_memory_store {"key":"sky","content":"the sky is blue"}`, nil); len(rs) != 1 || rs[0].Status != "completed" {
		t.Fatalf("store: %+v", rs)
	}
	watcher := s.Dial(t)
	if _, err := watcher.Initialize(); err != nil {
		t.Fatal(err)
	}
	if h, err := healthOf(watcher); err != nil || h["plugin-sandbox"].Status != "serving" {
		t.Fatalf("health before the stop: %v, %v", h, err)
	}
	pid := s.PIDOf("plugin-sandbox")
	if pid == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}

	// Stopped while the turn waits for the tool call's approval: its
	// tool listing (the turn's start) was answered, its calls come after.
	var (
		resume  func()
		stopped time.Time
		health  = make(chan healthSaw, 1)
	)
	rs := approvedTurn(t, v, id, `/tool `+echoTool+` {"msg":"hung?"}`+"\n"+`/tool plugin_memory_recall {"query":"blue"}`, func() {
		resume = hang(t, pid)
		testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
			if st, err := procstat.Read(pid); err != nil || st.State != 'T' {
				return fmt.Errorf("sandbox %d not stopped yet: %v", pid, err)
			}
			return nil
		})
		stopped = time.Now()
		go watchSandboxHealth(watcher, stopped, health)
	})
	if len(rs) != 2 {
		t.Fatalf("two tool results expected: %+v", rs)
	}
	for _, r := range rs {
		t.Logf("%s %s %v after the stop: %s", r.name, r.Status, r.at.Sub(stopped).Round(time.Millisecond), r.RawOutput)
		if r.Status != "failed" || !strings.Contains(r.RawOutput, "plugin sandbox unavailable") {
			t.Errorf("%s on the stopped sandbox: %s %q, want failed, the sandbox unavailable", r.name, r.Status, r.RawOutput)
		}
	}
	saw := <-health
	if saw.err != nil {
		t.Fatal(saw.err)
	}
	t.Logf("health said plugin-sandbox %s %v after the stop (%s)", saw.status, saw.at.Sub(stopped).Round(time.Millisecond), saw.why)

	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	_, err := c.Call("plugins/list", map[string]any{})
	var re *rpcclient.RPCError
	t.Logf("plugins/list failed after %v: %v", time.Since(asked).Round(time.Millisecond), err)
	if !errors.As(err, &re) || !strings.HasPrefix(re.Message, "plugin-sandbox: no replica is reachable (") {
		t.Errorf("plugins/list on the stopped sandbox: %v, want plugin-sandbox: no replica is reachable", err)
	}

	// The launcher's view: the process leaves its health unanswered.
	// Its probe waits up to a second for an answer, and the calls above
	// now end within a second of the stop (the process's state), where
	// they took 2.5 s: status is asked until the launcher has seen it.
	var out string
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		out, err = clawmesh(t, s, "status")
		if err == nil || !strings.Contains(out, "not every service is serving: plugin-sandbox hung") {
			return fmt.Errorf("clawmesh status with the sandbox stopped: %v\n%s", err, out)
		}
		return nil
	})
	t.Logf("clawmesh status: %s", out)

	resume()
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		if _, err := c.Call("plugins/list", map[string]any{}); err != nil {
			return err
		}
		h, err := healthOf(c)
		if err != nil {
			return err
		}
		if st := h["plugin-sandbox"].Status; st != "serving" {
			return fmt.Errorf("plugin-sandbox %s", st)
		}
		return nil
	})
	rs = approvedTurn(t, v, id, `/tool `+echoTool+` {"msg":"back"}`+"\n"+`/tool plugin_memory_recall {"query":"blue"}`, nil)
	if len(rs) != 2 || rs[0].RawOutput != "back" || !strings.Contains(rs[1].RawOutput, `"key":"sky"`) {
		t.Fatalf("calls after SIGCONT: %+v", rs)
	}
}

// result is a tool_result and when it came.
type result struct {
	update
	Status string `json:"status"`
	name   string
	at     time.Time
}

// approvedTurn runs prompt in session id, accepting each approval it
// asks after calling before (when not nil, on the first ask only), and
// returns its tool results. A turn that has not ended after hungBound
// fails the test.
func approvedTurn(t *testing.T, v *conv, id, prompt string, before func()) []result {
	t.Helper()
	req := v.send("session/prompt", map[string]any{"session_id": id, "prompt": prompt})
	end := time.Now().Add(hungBound)
	names := map[string]string{}
	var rs []result
	for {
		f, line, err := v.c.Read(time.Until(end))
		if err != nil {
			t.Fatalf("the turn %q has not ended within %v: %v (%q)", prompt, hungBound, err, line)
		}
		switch {
		case f.Method == "elicitation/create":
			if before != nil {
				before()
				before = nil
			}
			v.c.Send(`{"jsonrpc":"2.0","id":` + string(f.ID) + `,"result":{"action":"accept","content":{"choice":"allow_once"}}}`)
		case f.Method == "session/update":
			var r result
			if err := json.Unmarshal(f.Params, &r); err != nil {
				t.Fatalf("bad update %s: %v", f.Params, err)
			}
			switch r.Type {
			case "tool_call":
				names[r.ToolCallID] = r.Name
			case "tool_result":
				r.name, r.at = names[r.ToolCallID], time.Now()
				rs = append(rs, r)
			}
		case f.Method == "" && string(f.ID) == req:
			if f.Error != nil {
				t.Fatalf("prompt %q: %v", prompt, f.Error)
			}
			return rs
		}
	}
}

// healthSaw is what health said of the sandbox once it stopped serving.
type healthSaw struct {
	status, why string
	at          time.Time
	err         error
}

// watchSandboxHealth asks c's health every 20 ms until it says the sandbox
// is not serving, or hungBound after since.
func watchSandboxHealth(c *e2e.Client, since time.Time, saw chan<- healthSaw) {
	for time.Since(since) < hungBound {
		h, err := healthOf(c)
		if err != nil {
			saw <- healthSaw{err: err}
			return
		}
		if p := h["plugin-sandbox"]; p.Status != "serving" {
			why := ""
			if p.LastError != nil {
				why = *p.LastError
			}
			saw <- healthSaw{status: p.Status, why: why, at: time.Now()}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	saw <- healthSaw{err: fmt.Errorf("health still says the sandbox serves %v after its stop", hungBound)}
}

// The launcher's liveness probe notices a hung sandbox as it does any
// process: after its limit of silence it kills it, and the restarted
// one serves the session's tool calls and plugins/list (the session's
// connection to the stopped one, and the calls on it, end with the
// kill).
func TestAHungSandboxIsReplacedByTheLauncher(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"}, "--liveness-timeout", "3s")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	pid := s.PIDOf("plugin-sandbox")
	if pid == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}
	hang(t, pid)
	stopped := time.Now()
	var replaced time.Time
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() error {
		if p := s.PIDOf("plugin-sandbox"); p == 0 || p == pid {
			return errors.New("the hung sandbox is not replaced yet")
		}
		replaced = time.Now()
		return nil
	})
	if !strings.Contains(s.Stderr(), "process not answering its health check, killing it") {
		t.Error("the launcher did not log the liveness kill")
	}
	waitForPluginTool(t, v, echoTool)
	served := time.Now()
	listPlugins(t, v)
	t.Logf("replaced %v after the stop (liveness 3s); a tool call served %v after that",
		replaced.Sub(stopped).Round(time.Millisecond), served.Sub(replaced).Round(time.Millisecond))
}
