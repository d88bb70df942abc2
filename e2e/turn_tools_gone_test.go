package e2e_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two sandbox replicas killed at once, for good (their binary taken
// away): the turn made right after is told it has no plugin tools, and
// why. The session's listing was tried once more only, and both tries
// could be picked on a replica whose end its client had not yet seen:
// the turn was told "it is unavailable", which says nothing of what
// happened. The prompt is sent right after the kills. It must say that no replica can be reached, or that none
// served within the listing's bound (restartOutlasted); the times are
// logged.
func TestATurnWithEveryReplicaKilledAtOnceIsToldNoneCanBeReached(t *testing.T) {
	t.Parallel()
	bin := linkedBinDir(t)
	s := pluginStack(t, []string{"echo"}, "--scale", "plugin-sandbox=2", "--bin-dir", bin)
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	id := v.newSession("")
	// Each method takes the replicas in turn: the session's client has
	// a connection to both once two turns listed the tools.
	for range 2 {
		if _, results, all := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"up"}`); len(results) != 1 || results[0].Status != "completed" {
			t.Fatalf("a turn before the kill: %+v", all)
		}
	}
	if err := os.Remove(filepath.Join(bin, "plugin-sandbox")); err != nil {
		t.Fatal(err)
	}
	pids := []int{replicaPID(t, s, 0), replicaPID(t, s, 1)}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	// The prompt goes at once, as a client's would: the session's client
	// has not yet seen the connections end.
	start := time.Now()
	_, results, all := toolTurn(t, v, id, "/tool "+echoTool+` {"msg":"gone"}`+"\n/say end")
	took := time.Since(start)
	n := pluginNotices(all)
	if len(results) != 1 || results[0].Status != "failed" || !strings.HasPrefix(results[0].RawOutput, "Unknown tool") ||
		len(n) != 1 || all[0].Type != "agent_thought_chunk" {
		t.Fatalf("a turn with every replica killed: %+v", all)
	}
	t.Logf("the turn made once both replicas were killed answered after %v, told %q", took.Round(time.Millisecond), n[0])
	if !restartOutlasted(n[0]) {
		t.Errorf("a turn with every replica killed at once was told %q; want that no replica can be reached or none served in time", n[0])
	}
}
