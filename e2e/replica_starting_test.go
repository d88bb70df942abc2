package e2e_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// A sandbox replica restarted while the other serves (--scale
// plugin-sandbox=2) answers on its socket during its whole start (its
// health says each compile), and every call the gateway (plugins/list)
// or the session (tool calls) spread to it failed Unavailable,
// "plugin-sandbox unavailable" at the socket, while the other replica
// served. The test holds the restarted replica in its start by holding
// the compilation cache's lock (<data>/wasm-cache.lock), which its load
// of each plugin waits for: status says it starts and why, and every
// call is served by the other replica until it serves; then it is
// given calls again.
func TestCallsGoToTheReplicaServingWhileTheOtherStarts(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"}, "--scale", "plugin-sandbox=2")
	// Once failed under the whole suite's load (CI, the sixtieth round:
	// after the release no call reached the restarted replica in 60 s),
	// not alone: on a failure the logs that say which side kept it out
	// are kept in the test's output.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, name := range []string{"plugin-sandbox.1", "session"} {
			raw, _ := os.ReadFile(filepath.Join(s.DataDir, "logs", name+".log"))
			lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
			t.Logf("the last lines of %s's log:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)

	// Status still tells the starting replica apart, with what it waits for.
	release := holdInStart(t, s, 1, "plugin-sandbox.1")

	for range 10 {
		listPlugins(t, v) // fails the test on an error
	}
	id := v.newSession("")
	for i := range 5 {
		_, results, _ := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"a"}`+"\n/tool "+echoTool+` {"msg":"b"}`)
		if len(results) != 2 {
			t.Fatalf("turn %d: %d results, want 2: %+v", i, len(results), results)
		}
		for _, r := range results {
			if r.Status != "completed" {
				t.Fatalf("turn %d, a tool call while one replica starts: %+v", i, r)
			}
		}
	}
	if out, err := clawmesh(t, s, "status"); err == nil || !strings.Contains(statusLine(out, "plugin-sandbox.1"), "waiting for another replica's compile") {
		t.Fatalf("the replica was not held in its start all along (%v):\n%s", err, out)
	}

	release()
	waitFor(t, "status with every replica serving", 60*time.Second, func() bool {
		_, err := clawmesh(t, s, "status")
		return err == nil
	})
	before := toolCallsServed(replicaLogs(s, 2)[1])
	// A turn with one tool call is a ListTools and an ExecuteTool: with
	// one round-robin turn over both methods every ExecuteTool went to
	// the same replica until the replica set changed (a connection's
	// age, 30 s), and this wait failed in CI. The turns it took are
	// logged: one or two when each method is spread by itself.
	turns := 0
	waitFor(t, "a tool call served by the restarted replica", 60*time.Second, func() bool {
		turns++
		toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"c"}`)
		return toolCallsServed(replicaLogs(s, 2)[1]) > before
	})
	t.Logf("the restarted replica served a tool call at turn %d", turns)
}

// Memory calls went to the first replica only (grpcclient.DialOne,
// pick_first), since a memory plugin's entries were once in its
// instance alone, and failed while that replica started ("starting:
// waiting for another replica's compile") though the other served. The
// replicas share the memory journals (any replica gives its instance
// what another stored), so memory calls are now spread like tool calls:
// while the first replica is held in its start they go to the other,
// which finds the memory stored before.
func TestMemoryCallsGoToTheReplicaServingWhileTheFirstStarts(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo", "kv"}, "--scale", "plugin-sandbox=2")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	_, results, _ := toolTurn(t, v, id, `/tool plugin_memory_store {"key":"sky","content":"the sky is blue"}`)
	if len(results) != 1 || results[0].Status != "completed" {
		t.Fatalf("store: %+v", results)
	}

	holdInStart(t, s, 0, "plugin-sandbox") // released at the test's end

	for i := range 3 {
		_, results, _ := toolTurn(t, v, id, `/tool plugin_memory_recall {"query":"blue"}`+"\n"+`/tool plugin_memory_store {"key":"sea","content":"the sea is blue"}`)
		if len(results) != 2 {
			t.Fatalf("turn %d: %d results, want 2: %+v", i, len(results), results)
		}
		for _, r := range results {
			if r.Status != "completed" {
				t.Fatalf("turn %d, a memory call while the first replica starts: %+v", i, r)
			}
		}
		if !strings.Contains(results[0].RawOutput, `"key":"sky"`) {
			t.Fatalf("turn %d: the recall did not find the memory: %+v", i, results[0])
		}
	}
	if out, err := clawmesh(t, s, "status"); err == nil || !strings.Contains(statusLine(out, "plugin-sandbox"), "waiting for another replica's compile") {
		t.Fatalf("the replica was not held in its start all along (%v):\n%s", err, out)
	}
}

// holdInStart kills replica i of s's plugin sandbox while the test holds
// the compilation cache's lock, so that its restart waits in its start
// (for another replica's compile) until release; it returns once status
// says so on the line of service. The replicas compile nothing once up:
// the lock is free. It is released at the test's end, if not before.
func holdInStart(t *testing.T, s *e2e.Stack, i int, service string) (release func()) {
	t.Helper()
	lock, err := os.OpenFile(filepath.Join(s.DataDir, "wasm-cache.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	waitFor(t, "the compilation cache's lock", 30*time.Second, func() bool {
		return syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
	})
	held := true
	release = func() {
		if held {
			held = false
			_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		}
	}
	t.Cleanup(release)

	old := replicaPID(t, s, i)
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, i, old); err != nil {
		t.Fatal(err)
	}
	line, _ := waitStatusLine(t, s, service, "waiting for another replica's compile")
	t.Logf("%s", line)
	return release
}
