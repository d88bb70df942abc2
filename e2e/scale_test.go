package e2e_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/e2e"
)

// replicaLogs are the logs of the sandbox replicas of a stack.
func replicaLogs(s *e2e.Stack, n int) []string {
	out := make([]string, n)
	for i := range n {
		name := "plugin-sandbox"
		if i > 0 {
			name = fmt.Sprintf("plugin-sandbox.%d", i)
		}
		out[i] = filepath.Join(s.DataDir, "logs", name+".log")
	}
	return out
}

// toolCallsServed counts the tool calls a replica's log says it ran.
func toolCallsServed(path string) int {
	raw, _ := os.ReadFile(path)
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"tool executed"`) && strings.Contains(line, echoTool) {
			n++
		}
	}
	return n
}

// replicaPID is the pid of sandbox replica i, found by the socket it
// listens on.
func replicaPID(t *testing.T, s *e2e.Stack, i int) int {
	t.Helper()
	sock := datadir.ServiceSocket(s.DataDir, "plugin-sandbox", i)
	for pid, name := range s.PIDs() {
		if name != "plugin-sandbox" {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(raw), "\x00"+sock+"\x00") {
			return pid
		}
	}
	t.Fatalf("no process listens on %s", sock)
	return 0
}

// turnResult is what one client saw of one turn.
type turnResult struct {
	outcome       string
	ok, failedRes int
}

// runTurns opens a session on its own connection and runs turns prompts,
// each calling the echo tool twice. It reports every turn on done and
// returns the first error; it never touches t (it runs on a goroutine).
func runTurns(socket string, client, turns int, done chan<- turnResult) error {
	c, err := e2e.Dial(socket)
	if err != nil {
		return err
	}
	defer c.Close()
	c.Timeout = 90 * time.Second
	if _, err := c.Initialize(); err != nil {
		return err
	}
	raw, err := c.Call("session/new", map[string]any{})
	if err != nil {
		return err
	}
	var sess struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(raw, &sess); err != nil || sess.SessionID == "" {
		return fmt.Errorf("session/new: %s (%v)", raw, err)
	}
	for n := range turns {
		var res turnResult
		c.OnFrame = func(f *e2e.Frame, _ []byte) {
			var u pluginUpdate
			if f.Method != "session/update" || json.Unmarshal(f.Params, &u) != nil || u.Type != "tool_result" {
				return
			}
			if u.Status == "completed" && strings.HasPrefix(u.RawOutput, fmt.Sprintf("c%d-t%d-", client, n)) {
				res.ok++
			} else {
				res.failedRes++
			}
		}
		prompt := fmt.Sprintf("/tool %s {\"msg\":\"c%d-t%d-a\"}\n/tool %s {\"msg\":\"c%d-t%d-b\"}", echoTool, client, n, echoTool, client, n)
		raw, err := c.Call("session/prompt", map[string]any{"session_id": sess.SessionID, "prompt": prompt})
		if err != nil {
			return fmt.Errorf("client %d turn %d: %w", client, n, err)
		}
		var r struct {
			Outcome string `json:"outcome"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("client %d turn %d: %s", client, n, raw)
		}
		res.outcome = r.Outcome
		done <- res
	}
	return nil
}

// Three sandbox processes behind one session service: tool calls spread
// over all three; one is killed while several clients run turns; every
// turn finishes, the calls after the kill go to the replicas alive, and
// the launcher brings the killed one back.
func TestThreeSandboxesShareCallsAndSurviveAKill(t *testing.T) {
	t.Parallel()
	const replicas = 3
	s := pluginStack(t, []string{"echo"}, "--scale", fmt.Sprintf("plugin-sandbox=%d", replicas))
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	logs := replicaLogs(s, replicas)
	counts := func() []int {
		out := make([]int, replicas)
		for i, l := range logs {
			out[i] = toolCallsServed(l)
		}
		return out
	}

	// Calls of one turn are consecutive picks of the round-robin balancer:
	// poll until every replica is connected and has served.
	id := v.newSession("")
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, results, _ := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"x"}`+"\n/tool "+echoTool+` {"msg":"y"}`+"\n/tool "+echoTool+` {"msg":"z"}`)
		if len(results) != 3 || results[0].RawOutput != "x" || results[2].RawOutput != "z" {
			t.Fatalf("spreading turn: %+v", results)
		}
		c := counts()
		if c[0] > 0 && c[1] > 0 && c[2] > 0 {
			t.Logf("every replica served: %v", c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every replica served a call: %v", c)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Several clients' turns; replica 1 is killed once some have finished.
	const clients, turns = 3, 8
	done := make(chan turnResult, clients*turns)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- runTurns(s.Socket, c, turns, done)
		}()
	}
	var finished atomic.Int32
	results := make([]turnResult, 0, clients*turns)
	collect := make(chan struct{})
	go func() {
		defer close(collect)
		for r := range done {
			results = append(results, r)
			finished.Add(1)
		}
	}()
	victim := replicaPID(t, s, 1)
	deadline = time.Now().Add(time.Minute)
	for finished.Load() < clients {
		if time.Now().After(deadline) {
			t.Fatalf("only %d turns finished in a minute", finished.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	atKill, servedAtKill := finished.Load(), counts()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatalf("kill replica 1 (pid %d): %v", victim, err)
	}
	wg.Wait()
	close(done)
	<-collect
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	if atKill == 0 || int(atKill) >= clients*turns {
		t.Fatalf("the kill came after %d of %d turns: not mid-traffic", atKill, clients*turns)
	}
	if len(results) != clients*turns {
		t.Fatalf("%d of %d turns finished", len(results), clients*turns)
	}
	ok, failed := 0, 0
	for i, r := range results {
		if r.outcome != "completed" {
			t.Errorf("turn %d: outcome %q", i, r.outcome)
		}
		ok += r.ok
		failed += r.failedRes
	}
	after := counts()
	t.Logf("killed replica 1 after %d of %d turns; served before %v, after %v; tool results: %d succeeded, %d failed (in flight on the killed replica)",
		atKill, clients*turns, servedAtKill, after, ok, failed)
	if ok+failed != 2*clients*turns {
		t.Errorf("%d tool results for %d calls", ok+failed, 2*clients*turns)
	}
	// The replicas alive served the traffic after the kill.
	if after[0] <= servedAtKill[0] || after[2] <= servedAtKill[2] {
		t.Errorf("the replicas alive served nothing after the kill: %v then %v", servedAtKill, after)
	}
	// The launcher restarts the killed replica, which serves again.
	if err := waitRestarted(s, 1, victim); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(90 * time.Second)
	for base := counts()[1]; counts()[1] == base; {
		toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"again"}`)
		if time.Now().After(deadline) {
			t.Fatalf("the restarted replica serves nothing: %v", counts())
		}
	}
}

// waitRestarted waits until replica i runs again under another pid.
func waitRestarted(s *e2e.Stack, i, old int) error {
	sock := datadir.ServiceSocket(s.DataDir, "plugin-sandbox", i)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for pid, name := range s.PIDs() {
			raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if name == "plugin-sandbox" && pid != old && strings.Contains(string(raw), "\x00"+sock+"\x00") {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the killed replica %d was not restarted", i)
}
