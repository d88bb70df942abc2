package e2e_test

import (
	"testing"
	"time"
)

// stoppedWait is the client's bound on the first plugins/list after the
// sandbox stops: under the 2.5 s a kept connection paid to find the hang
// (a check left unanswered for 2 s) and the 3 s a client that had never
// connected paid (a connect timed out, and the grace). A bound against
// the old wait, not a measure of speed: the times are logged.
const stoppedWait = 2 * time.Second

// The first plugins/list after a stop (SIGSTOP) waited for a health
// check on the gateway's kept connection to go unanswered for 2 s
// (ProbeTimeout), 2.5 s in all, or, when the gateway had not used the
// sandbox yet, for a connect to time out and the grace to run, 3 s. The
// process's state says it at once: its pid is the connection's peer
// (SO_PEERCRED), and state T is a stopped process, not a slow one. Both
// cases must answer within stoppedWait that no replica answers because
// it is stopped; a turn made first (the session service's client, which
// reads the same state) is told so too.
func TestTheFirstPluginsListAfterAStopIsAnsweredByTheProcessState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		used bool // plugins/list called before the stop: the kept client connected
	}{{"kept connection", true}, {"never connected", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := pluginStack(t, []string{"echo"}, "--liveness-timeout", "10m")
			v := newConv(t, s, nil)
			waitForPluginTool(t, v, echoTool)
			if tc.used {
				if l := listPlugins(t, v); len(l.Plugins) != 1 {
					t.Fatalf("plugins/list before the stop: %+v", l)
				}
			}
			pid := s.PIDOf("plugin-sandbox")
			if pid == 0 {
				t.Fatalf("no plugin-sandbox among %v", s.PIDs())
			}
			stopped, resume := stopSandbox(t, pid)
			defer resume()

			asked := time.Now()
			_, err := pluginsListWithin(t, s, stoppedWait)
			t.Logf("first plugins/list %v after the stop, answered in %v: %v",
				asked.Sub(stopped).Round(time.Millisecond), time.Since(asked).Round(time.Millisecond), err)
			wantHung(t, "the first plugins/list after the stop", err)
		})
	}
}
