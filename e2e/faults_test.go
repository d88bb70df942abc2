package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// healthComponents is the components part of a health reply.
type healthComponents map[string]struct {
	Status       string  `json:"status"`
	LastError    *string `json:"last_error"`
	RestartCount int     `json:"restart_count"`
}

func healthOf(c *e2e.Client) (healthComponents, error) {
	raw, err := c.Call("health", map[string]any{})
	if err != nil {
		return nil, err
	}
	var h struct {
		Components healthComponents `json:"components"`
	}
	return h.Components, json.Unmarshal(raw, &h)
}

// sample is one observation made while a fault is on.
type sample struct {
	at   time.Time
	what string // method, or "health:<component>"
	err  error
	info string // health: status and last_error
}

// recorder keeps samples from several goroutines.
type recorder struct {
	mu      sync.Mutex
	samples []sample
}

func (r *recorder) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
}

func (r *recorder) all() []sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sample(nil), r.samples...)
}

// traffic runs calls on their own connections until stop closes,
// recording each outcome.
func traffic(t *testing.T, s *e2e.Stack, rec *recorder, stop <-chan struct{}, wg *sync.WaitGroup, calls map[string]any) {
	for method, params := range calls {
		c := s.Dial(t)
		c.Timeout = 20 * time.Second
		if _, err := c.Initialize(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := c.Call(method, params)
				rec.add(sample{at: time.Now(), what: method, err: err})
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
}

// watchHealth polls health until stop closes, recording each component
// that is not serving.
func watchHealth(t *testing.T, s *e2e.Stack, rec *recorder, stop <-chan struct{}, wg *sync.WaitGroup) {
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			h, err := healthOf(c)
			now := time.Now()
			if err != nil {
				rec.add(sample{at: now, what: "health", err: err})
			}
			for name, comp := range h {
				if comp.Status != "serving" {
					why := ""
					if comp.LastError != nil {
						why = *comp.LastError
					}
					rec.add(sample{at: now, what: "health:" + name, info: comp.Status + ": " + why})
				}
			}
			time.Sleep(25 * time.Millisecond)
		}
	}()
}

// everyMethodWorks runs each socket method once; nil when all answer.
func everyMethodWorks(c *e2e.Client, session string) error {
	var newS struct {
		SessionID string `json:"session_id"`
	}
	steps := []struct {
		method string
		params any
		out    any
	}{
		{"status", map[string]any{}, nil},
		{"health", map[string]any{}, nil},
		{"config/get", map[string]any{"prop": "agents.default.system_prompt"}, nil},
		{"config/list", map[string]any{"prefix": "rpc"}, nil},
		{"config/set", map[string]any{"prop": "agents.default.model", "value": "after-fault"}, nil},
		{"config/set-many", map[string]any{"sets": []map[string]any{{"prop": "agents.default.model", "value": "after-fault-2"}}}, nil},
		{"session/new", map[string]any{}, &newS},
		{"session/list", map[string]any{}, nil},
		{"session/state", map[string]any{"session_id": session}, nil},
		{"session/messages", map[string]any{"session_id": session}, nil},
		{"session/prompt", map[string]any{"session_id": session, "prompt": "/say again"}, nil},
		{"session/cancel", map[string]any{"session_id": session}, nil},
	}
	for _, st := range steps {
		raw, err := c.Call(st.method, st.params)
		if err != nil {
			return fmt.Errorf("%s: %w", st.method, err)
		}
		if st.out != nil {
			if err := json.Unmarshal(raw, st.out); err != nil {
				return err
			}
		}
	}
	for _, m := range []string{"session/close", "session/delete"} {
		if _, err := c.Call(m, map[string]any{"session_id": newS.SessionID}); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
	}
	return nil
}

// PostgreSQL killed outright under traffic: the launcher restarts it like
// any process; meanwhile calls that need it fail with -32603 "<service>:
// database unavailable" and health says not_serving with the reason;
// within 10 s of the restart every method works again, and what was
// committed (config, transcript) is intact.
func TestPostgresKilledUnderTraffic(t *testing.T) {
	if strings.TrimSpace(testenvDatabaseURL()) != "" {
		t.Skip("DATABASE_URL selects an external server: no private cluster to kill")
	}
	s := e2e.Start(t, e2e.Options{})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	call(t, c, "config/set", map[string]any{"prop": "agents.default.system_prompt", "value": "kept across the fault"})
	v := newConv(t, s, nil)
	session := v.newSession("")
	v.call("session/prompt", map[string]any{"session_id": session, "prompt": "/say before the fault"})
	before := v.call("session/messages", map[string]any{"session_id": session})

	rec := &recorder{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	traffic(t, s, rec, stop, &wg, map[string]any{
		"session/state":    map[string]any{"session_id": session},
		"session/messages": map[string]any{"session_id": session},
		"session/list":     map[string]any{},
		"config/set":       map[string]any{"prop": "agents.default.model", "value": "during-fault"},
	})
	watchHealth(t, s, rec, stop, &wg)
	stopped := false
	stopTraffic := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopTraffic()
	time.Sleep(300 * time.Millisecond) // traffic flowing before the fault

	old := s.PIDOf("postgres")
	if old == 0 {
		t.Fatalf("no postmaster among %v", s.PIDs())
	}
	killed := time.Now()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var restarted time.Time
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		if p := s.PIDOf("postgres"); p == 0 || p == old {
			return errors.New("postgres not restarted yet")
		}
		restarted = time.Now()
		return nil
	})
	var recovered time.Time
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if err := everyMethodWorks(c, session); err != nil {
			return err
		}
		recovered = time.Now()
		return nil
	})
	time.Sleep(300 * time.Millisecond) // traffic flowing after the recovery
	stopTraffic()
	t.Logf("postmaster restarted %v after SIGKILL; every method worked again %v after the restart",
		restarted.Sub(killed).Round(time.Millisecond), recovered.Sub(restarted).Round(time.Millisecond))

	var failed, notServing int
	var firstFail, lastFail time.Time
	for _, sm := range rec.all() {
		switch {
		case strings.HasPrefix(sm.what, "health:"):
			if sm.at.After(killed) && strings.Contains(sm.info, "not_serving") && strings.Contains(sm.info, "database") {
				notServing++
			}
		case sm.what == "health":
			t.Errorf("health failed during the fault: %v", sm.err)
		case sm.err != nil:
			var re *e2e.RPCError
			service := strings.SplitN(sm.what, "/", 2)[0]
			if !errors.As(sm.err, &re) || re.Code != -32603 || re.Message != service+": database unavailable" {
				t.Errorf("%s during the fault: %v, want -32603 %q", sm.what, sm.err, service+": database unavailable")
			}
			if firstFail.IsZero() {
				firstFail = sm.at
			}
			lastFail = sm.at
			failed++
		}
	}
	if failed == 0 {
		t.Error("no call failed: the fault was not observed")
	} else {
		t.Logf("%d calls failed with database unavailable over %v", failed, lastFail.Sub(firstFail).Round(time.Millisecond))
	}
	if notServing == 0 {
		t.Error("health never said not_serving with the database as the reason")
	}
	if !strings.Contains(s.Stderr(), `"child":"postgres"`) || !strings.Contains(s.Stderr(), "process exited, restarting") {
		t.Error("the launcher did not log the postgres restart")
	}

	// What was committed before the fault is intact.
	got := call(t, c, "config/get", map[string]any{"prop": "agents.default.system_prompt"})
	if got["value"] != "kept across the fault" {
		t.Errorf("committed config after the fault: %v", got)
	}
	var msgs struct {
		Messages []json.RawMessage `json:"messages"`
	}
	var old2 struct {
		Messages []json.RawMessage `json:"messages"`
	}
	json.Unmarshal(before, &old2)
	json.Unmarshal(v.call("session/messages", map[string]any{"session_id": session}), &msgs)
	if len(msgs.Messages) < len(old2.Messages) {
		t.Fatalf("transcript lost rows: %d before, %d after", len(old2.Messages), len(msgs.Messages))
	}
	for i := range old2.Messages {
		if string(old2.Messages[i]) != string(msgs.Messages[i]) {
			t.Fatalf("transcript row %d changed: %s -> %s", i, old2.Messages[i], msgs.Messages[i])
		}
	}
}

func testenvDatabaseURL() string { return os.Getenv("DATABASE_URL") }
