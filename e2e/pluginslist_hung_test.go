package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// knownHungWait is the client's own bound on a plugins/list made once
// the gateway has found the sandbox hung: under a connect's 2 s
// (grpcclient.ConnectTimeout), which a call that dials or waits anew
// pays before it can say anything. A bound against a hang, not a
// measure of speed: the times are logged.
const knownHungWait = 1500 * time.Millisecond

// plugins/list made a client of its own for each call, so on a hung
// sandbox (SIGSTOP, kept stopped) every call paid a connect that timed
// out (2 s) and the rest of the grace (3 s in all), however many times
// it had been told so. The gateway now keeps one client of the
// sandbox's replicas, which remembers the replica it found hung: the
// first plugins/list after the stop finds it, and each one after it
// answers at once, saying the sandbox is stopped or hung. After SIGCONT
// it lists the plugins again.
func TestPluginsListOnAKnownHungSandboxAnswersAtOnce(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"}, "--liveness-timeout", "10m")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	if l := listPlugins(t, v); len(l.Plugins) != 1 {
		t.Fatalf("plugins/list before the stop: %+v", l)
	}
	pid := s.PIDOf("plugin-sandbox")
	if pid == 0 {
		t.Fatalf("no plugin-sandbox among %v", s.PIDs())
	}
	stopped, resume := stopSandbox(t, pid)

	asked := time.Now()
	_, err := pluginsListWithin(t, s, 0)
	t.Logf("first plugins/list %v after the stop, answered in %v: %v",
		asked.Sub(stopped).Round(time.Millisecond), time.Since(asked).Round(time.Millisecond), err)
	wantHung(t, "the first plugins/list after the stop", err)

	for i := range 3 {
		asked := time.Now()
		_, err := pluginsListWithin(t, s, knownHungWait)
		t.Logf("plugins/list %d once found hung, answered in %v: %v", i+2, time.Since(asked).Round(time.Millisecond), err)
		wantHung(t, fmt.Sprintf("plugins/list %d once the sandbox was found hung", i+2), err)
	}

	resume()
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		raw, err := c.Call("plugins/list", map[string]any{})
		if err != nil {
			return err
		}
		var l pluginsList
		if err := json.Unmarshal(raw, &l); err != nil || len(l.Plugins) != 1 {
			return fmt.Errorf("plugins/list after SIGCONT: %s (%v)", raw, err)
		}
		return nil
	})
}

// pluginsListWithin calls plugins/list on a connection of its own
// (a reply that comes after the client gave up must not be read as the
// next call's), waiting at most wait for its answer (0: the client's
// default).
func pluginsListWithin(t *testing.T, s *e2e.Stack, wait time.Duration) (json.RawMessage, error) {
	t.Helper()
	c := s.Dial(t)
	defer c.Close()
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	c.Timeout = wait
	return c.Call("plugins/list", map[string]any{})
}

// wantHung fails the test unless err is plugins/list's error saying that
// no sandbox replica answers because it is stopped or hung.
func wantHung(t *testing.T, what string, err error) {
	t.Helper()
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || !strings.HasPrefix(re.Message, "plugin-sandbox: no replica is reachable (") ||
		!strings.Contains(re.Message, "stopped or hung") {
		t.Errorf("%s: %v, want plugin-sandbox: no replica is reachable (… stopped or hung)", what, err)
	}
}

// Two sandbox replicas, one stopped (SIGSTOP) after the gateway's client
// has used both: plugins/list is answered by the other, its plugins
// listed, the call that is picked on the stopped one and finds it hung
// included (it is made again, on the other), and every call after that
// finding within knownHungWait.
func TestPluginsListGoesToTheReplicaThatAnswers(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"}, "--scale", "plugin-sandbox=2", "--liveness-timeout", "10m")
	v := newConv(t, s, nil)
	waitForPluginTool(t, v, echoTool)
	// Each method takes the replicas in turn: four calls reach both.
	for range 4 {
		if l := listPlugins(t, v); len(l.Plugins) != 1 {
			t.Fatalf("plugins/list before the stop: %+v", l)
		}
	}
	stopped, _ := stopSandbox(t, replicaPID(t, s, 0))

	list := func(what string, wait time.Duration) {
		t.Helper()
		asked := time.Now()
		raw, err := pluginsListWithin(t, s, wait)
		t.Logf("%s, %v after the stop, answered in %v: %v",
			what, asked.Sub(stopped).Round(time.Millisecond), time.Since(asked).Round(time.Millisecond), err)
		var l pluginsList
		if err == nil {
			err = json.Unmarshal(raw, &l)
		}
		if err != nil || len(l.Plugins) != 1 || l.Plugins[0]["name"] != "echo" {
			t.Errorf("%s with one replica stopped: %s, %v; want the echo plugin listed", what, raw, err)
		}
	}
	// Each method takes the replicas in turn, so one of the first two
	// calls is picked on the stopped replica and finds it hung.
	list("plugins/list 1", 0)
	list("plugins/list 2", 0)
	for i := range 4 {
		list(fmt.Sprintf("plugins/list %d", i+3), knownHungWait)
	}
}
