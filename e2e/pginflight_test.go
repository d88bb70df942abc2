package e2e_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// PostgreSQL hangs (SIGSTOP, postmaster and backends) while calls are
// already on their way to it: once health says the database is gone,
// those calls too answer -32603 "<service>: database unavailable", not
// only the calls made after, and nothing they began is stored once the
// server runs again (their transactions roll back). Before, a call in
// flight when the stall began waited its whole deadline (10 s) on a
// server that did not answer, health saying the database was gone for
// most of it.
func TestPostgresStallEndsCallsInFlight(t *testing.T) {
	t.Parallel()
	s, c, session := stackToStallPostgres(t)
	call(t, c, "config/set", map[string]any{"prop": "agents.default.system_prompt", "value": "before-the-stall"})
	sessions := func() int {
		t.Helper()
		l, _ := call(t, c, "session/list", map[string]any{"include_closed": true})["sessions"].([]any)
		return len(l)
	}
	before := sessions()
	calls := []struct {
		method string
		params any
	}{
		{"session/new", map[string]any{}},
		{"session/prompt", map[string]any{"session_id": session, "prompt": "/say in flight"}},
		{"config/set", map[string]any{"prop": "agents.default.system_prompt", "value": "in-flight"}},
	}
	conns := make([]*e2e.Client, len(calls))
	for i := range calls {
		conns[i] = s.Dial(t)
		if _, err := conns[i].Initialize(); err != nil {
			t.Fatal(err)
		}
		// A bound on a hang, not a timing: past the calls' own deadline
		// (10 s), which each waited before.
		conns[i].Timeout = 15 * time.Second
	}
	resume := hangPostgres(t, s)
	stopped := time.Now()
	answers := make([]sample, len(calls))
	took := make([]time.Duration, len(calls))
	var wg sync.WaitGroup
	for i, m := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := conns[i].Call(m.method, m.params)
			took[i] = time.Since(start)
			answers[i] = sample{at: time.Now(), what: m.method, err: err}
		}()
	}
	wg.Wait()
	for i, a := range answers {
		wantFailedAs(t, a, "database unavailable", "in flight when PostgreSQL hung")
		t.Logf("%s answered %v after %v", a.what, a.err, took[i].Round(time.Millisecond))
	}
	// Each service logs a call the watch cut as what happened to it:
	// it logged "timeout: i/o timeout", the deadline pgx sets on the
	// connection to end it, as if the call had merely run out of time.
	// The launcher copies each process's log into its file as it comes:
	// a line written as the call ended may land a moment after its
	// answer (once, at load, it had not when the files were read).
	var timedOut []string
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		cut := 0
		timedOut = timedOut[:0]
		for _, name := range []string{"session", "config"} {
			raw, err := os.ReadFile(filepath.Join(s.DataDir, "logs", name+".log"))
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(raw), "\n") {
				if !strings.Contains(line, "rpc failed: dependency unavailable") {
					continue
				}
				if strings.Contains(line, "i/o timeout") {
					timedOut = append(timedOut, name+": "+line)
				}
				if strings.Contains(line, "database unavailable (given up: it did not answer the last check)") {
					cut++
				}
			}
		}
		if cut == 0 {
			return errors.New("no service logged a call the watch cut as given up")
		}
		return nil
	})
	for _, l := range timedOut {
		t.Errorf("logged a call the watch cut as a timeout: %s", l)
	}
	resume()
	resumed := time.Now()
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		return everyMethodWorks(c, session)
	})
	if n := sessions(); n != before {
		t.Errorf("%d sessions after a session/new that failed, %d before", n, before)
	}
	if got := call(t, c, "config/get", map[string]any{"prop": "agents.default.system_prompt"}); got["value"] != "before-the-stall" {
		t.Errorf("after a config/set that failed: %v", got)
	}
	t.Logf("stall began %v before the calls ended; every method worked %v after it ended",
		time.Since(stopped).Round(time.Millisecond), time.Since(resumed).Round(time.Millisecond))
}

// stackToStallPostgres starts a stack on a cluster of its own, which
// the test may stop (hangPostgres), with the launcher's liveness limit
// past the test, and gives it an initialized connection and a session
// made on it.
func stackToStallPostgres(t *testing.T) (*e2e.Stack, *e2e.Client, string) {
	t.Helper()
	s := e2e.Start(t, e2e.Options{PrivateCluster: true, Args: []string{"--liveness-timeout", "5m"}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	session, err := newSession(c)
	if err != nil {
		t.Fatal(err)
	}
	return s, c, session
}
