package main

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/launcher"
)

// A scaled service's replicas are each said by name, hung before
// restarting; a process the launcher knows nothing more of leaves the
// gateway's word.
func TestLauncherSaysEachReplica(t *testing.T) {
	now := time.Now()
	ls := &launcher.ProcessStates{ProbeEvery: time.Second, Liveness: 10 * time.Second, Processes: map[string]launcher.ProcessState{
		"plugin-sandbox":   {Restarts: 2, LastExit: "signal: killed", ExitedAt: now.Add(-time.Second), RestartAt: now.Add(3 * time.Second)},
		"plugin-sandbox.1": {PID: 42, StartedAt: now.Add(-time.Minute), Answered: true, SilentSince: now.Add(-4 * time.Second)},
		"session":          {PID: 7, StartedAt: now.Add(-time.Minute), Answered: true},
	}}
	word, why := launcherSays(ls, "plugin-sandbox", "unreachable", now)
	if word != "hung" || !strings.Contains(why, "plugin-sandbox: attempt 2 in 3s; last exit: signal: killed, 1s ago") ||
		!strings.Contains(why, "plugin-sandbox.1: pid 42 not answering health within 1s, silent for 4s; the launcher restarts it after 10s of silence") {
		t.Fatalf("launcherSays = %q, %q", word, why)
	}
	if word, why := launcherSays(ls, "session", "unreachable", now); word != "" {
		t.Fatalf("a running session said %q (%s)", word, why)
	}
	if word, _ := launcherSays(nil, "session", "unreachable", now); word != "" {
		t.Fatalf("no launcher states said %q", word)
	}
}

func TestProcessNameNamesASocket(t *testing.T) {
	for addr, want := range map[string]struct {
		name    string
		replica int
		ok      bool
	}{
		"session": {"session", 0, true}, "plugin-sandbox.1": {"plugin-sandbox", 1, true},
		"/run/x.sock": {}, "host:1": {}, "../etc": {}, "plugin-sandbox.0": {},
	} {
		name, replica, ok := processName(addr)
		if name != want.name || replica != want.replica || ok != want.ok {
			t.Errorf("processName(%q) = %q, %d, %v", addr, name, replica, ok)
		}
	}
}

// The spool's kept messages are counted per alias and plugin, oldest
// first; a link (to a message or to a folder) is not followed.
func TestSpoolWaitingCountsWithoutFollowingLinks(t *testing.T) {
	dir := t.TempDir()
	aliasDir := filepath.Join(datadir.ChannelSpool(dir), hex.EncodeToString([]byte("web")))
	owner := filepath.Join(aliasDir, "p-"+hex.EncodeToString([]byte("webhook2")), "r-1")
	if err := os.MkdirAll(owner, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-3 * time.Hour)
	for i, name := range []string{"1-a.msg", "2-b.msg", "lock"} {
		p := filepath.Join(owner, name)
		if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	outside := t.TempDir()
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(outside, strconv.Itoa(i)+".msg"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "0.msg"), filepath.Join(owner, "3-c.msg")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(aliasDir, "p-"+hex.EncodeToString([]byte("evil")))); err != nil {
		t.Fatal(err)
	}
	waits, truncated := spoolWaiting(dir)
	if truncated || len(waits) != 1 || waits[0].alias != "web" || waits[0].plugin != "webhook2" || waits[0].messages != 2 ||
		!waits[0].oldest.Equal(old.Truncate(time.Nanosecond)) && waits[0].oldest.Sub(old).Abs() > time.Second {
		t.Fatalf("spoolWaiting = %+v, %v", waits, truncated)
	}
	lines := spoolLines(waits, false, time.Now())
	if len(lines) != 1 || !strings.Contains(lines[0], `"web" → webhook2`) || !strings.Contains(lines[0], "2 kept, oldest 3h0m0s old") {
		t.Fatalf("lines %q", lines)
	}
}
