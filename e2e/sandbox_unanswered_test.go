package e2e_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// stopSandbox stops the plugin sandbox (SIGSTOP, kept stopped: the
// stack's liveness limit is past the test) and returns when it is
// stopped, and the function that lets it run again.
func stopSandbox(t *testing.T, pid int) (stopped time.Time, resume func()) {
	t.Helper()
	resume = hang(t, pid)
	testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
		if st, err := procstat.Read(pid); err != nil || st.State != 'T' {
			return fmt.Errorf("sandbox %d not stopped yet: %v", pid, err)
		}
		return nil
	})
	return time.Now(), resume
}

// A sandbox stops (SIGSTOP) with a plugin tool call running on the
// session's connection to it (the misbehave plugin's loop, its own limit
// far off), and a memory call is made on that connection right after.
// Both waited for the connection's keepalive (10 s of silence and 5 s
// for the ping's answer, so up to 15 s after the stop) and failed with
// its words, the tool "plugin sandbox unavailable" and nothing more.
// They now end once the sandbox leaves a health check on that
// connection unanswered (grpcclient.ProbeTimeout), each saying the
// sandbox is stopped or hung. The times from the stop are logged, not
// asserted.
func TestCallsOnAHungSandboxsConnectionEndWhenItDoesNotAnswer(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo", "kv", "misbehave"}, "--liveness-timeout", "10m",
		"--set", "plugins.limits.call_timeout_ms=100000", "--set", "plugins.limits.call_fuel=1000000000000",
		"--set", `agents.default.approval_required=["plugin_memory_recall"]`,
		"--set", "agents.default.approval_timeout_secs=3600")
	loop := newConv(t, s, nil)
	waitForPluginTool(t, loop, echoTool)
	loopID := loop.newSession("")
	v := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	id := v.newSession("")
	pid := s.PIDOf("plugin-sandbox")
	if pid == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}

	// The memory call's turn asks its approval (its tool listing
	// answered); meanwhile the loop runs in the sandbox, the sandbox
	// stops, and the approval lets the memory call go.
	var (
		stopped  time.Time
		loopDone = make(chan loopEnd, 1)
	)
	rs := approvedTurn(t, v, id, `/tool plugin_memory_recall {"query":"blue"}`, func() {
		before, err := procstat.Read(pid)
		if err != nil {
			t.Fatal(err)
		}
		loop.send("session/prompt", map[string]any{"session_id": loopID, "prompt": `/tool misbehave {"mode":"loop"}`})
		go readToolResult(loop, loopDone)
		// The loop spins in the sandbox: its CPU time grows.
		testenv.Eventually(t, 60*time.Second, 10*time.Millisecond, func() error {
			st, err := procstat.Read(pid)
			if err != nil {
				return err
			}
			if st.CPU-before.CPU < 300*time.Millisecond {
				return fmt.Errorf("the loop does not run in the sandbox yet (%v of CPU)", st.CPU-before.CPU)
			}
			return nil
		})
		stopped, _ = stopSandbox(t, pid)
	})
	if len(rs) != 1 {
		t.Fatalf("one tool result expected: %+v", rs)
	}
	t.Logf("memory call started after the stop: %s %v after it: %s", rs[0].Status, rs[0].at.Sub(stopped).Round(time.Millisecond), rs[0].RawOutput)
	if rs[0].Status != "failed" || !strings.Contains(rs[0].RawOutput, "plugin sandbox unavailable") || !strings.Contains(rs[0].RawOutput, "stopped or hung") {
		t.Errorf("the memory call on the stopped sandbox's connection: %s %q, want failed, the sandbox unavailable, stopped or hung", rs[0].Status, rs[0].RawOutput)
	}
	end := <-loopDone
	if end.err != nil {
		t.Fatal(end.err)
	}
	t.Logf("tool call in flight at the stop: %s %v after it: %s", end.r.Status, end.at.Sub(stopped).Round(time.Millisecond), end.r.RawOutput)
	if end.r.Status != "failed" || !strings.Contains(end.r.RawOutput, "plugin sandbox unavailable") || !strings.Contains(end.r.RawOutput, "stopped or hung") {
		t.Errorf("the tool call in flight on the stopped sandbox: %s %q, want failed, the sandbox unavailable, stopped or hung", end.r.Status, end.r.RawOutput)
	}
}

// loopEnd is the tool result of a turn read by readToolResult.
type loopEnd struct {
	r   pluginUpdate
	at  time.Time
	err error
}

// readToolResult reads v's frames until a tool_result, within hungBound,
// and sends it with when it came. It runs beside the test's goroutine,
// so it reports rather than fails.
func readToolResult(v *conv, out chan<- loopEnd) {
	end := time.Now().Add(hungBound)
	for {
		f, line, err := v.c.Read(time.Until(end))
		if err != nil {
			out <- loopEnd{err: fmt.Errorf("no tool result within %v: %w (%q)", hungBound, err, line)}
			return
		}
		if f.Method != "session/update" {
			continue
		}
		var u pluginUpdate
		if err := json.Unmarshal(f.Params, &u); err != nil {
			out <- loopEnd{err: fmt.Errorf("bad update %s: %w", f.Params, err)}
			return
		}
		if u.Type == "tool_result" {
			out <- loopEnd{r: u, at: time.Now()}
			return
		}
	}
}

// Turns while the sandbox is stopped: each listed the plugin tools at its
// start on the connection to the stopped sandbox and waited the
// listing's whole bound (3 s) for it, every turn, until the keepalive
// gave the connection up (up to 15 s after the stop). Once one turn has
// found the sandbox not answering, the next ones now start at once,
// told that they have no plugin tools because the sandbox is stopped or
// hung; once it runs again (SIGCONT) the tools come back. Each turn's
// time is logged, not asserted.
func TestTurnsWhileTheSandboxHangsStartAtOnce(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"}, "--liveness-timeout", "10m")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	pid := s.PIDOf("plugin-sandbox")
	if pid == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}
	stopped, resume := stopSandbox(t, pid)
	for i := 1; i <= 3; i++ {
		start := time.Now()
		_, results, all := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"hung"}`+"\n/say end")
		took := time.Since(start)
		n := pluginNotices(all)
		if len(results) != 1 || !strings.HasPrefix(results[0].RawOutput, "Unknown tool") || len(n) != 1 || all[0].Type != "agent_thought_chunk" {
			t.Fatalf("turn %d with the sandbox stopped: %+v", i, all)
		}
		t.Logf("turn %d, started %v after the stop: answered after %v; told %q", i, start.Sub(stopped).Round(time.Millisecond), took.Round(time.Millisecond), n[0])
		if i > 1 && !strings.Contains(n[0], "stopped or hung") {
			t.Errorf("turn %d waited for the stopped sandbox again (%v): told %q, want it stopped or hung", i, took.Round(time.Millisecond), n[0])
		}
	}

	resume()
	resumed := time.Now()
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		_, results, all := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"back"}`)
		if len(results) != 1 || results[0].RawOutput != "back" || len(pluginNotices(all)) != 0 {
			return fmt.Errorf("the plugin tools are not back yet: %+v", all)
		}
		return nil
	})
	t.Logf("the plugin tool served again %v after SIGCONT", time.Since(resumed).Round(time.Millisecond))
}
