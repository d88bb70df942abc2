package e2e_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// An openai agent's turn reads its api_key from the config service
// (Reveal) as it starts. With the config service hung (SIGSTOP), that
// call had no deadline of its own: the prompt waited for the gRPC
// keepalive to give up on the connection (about 15 s), then failed
// saying only "config service unavailable". The read is now bounded by
// configclient.CallTimeout, and the turn's failure says the config
// service did not answer.
func TestOpenAITurnWhileConfigIsHung(t *testing.T) {
	t.Parallel()
	// The launcher's liveness check would restart the hung config
	// service within the test.
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "10m"}})
	v := newConv(t, s, nil)
	v.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "agents.oa.provider", "value": "openai"},
		{"prop": "agents.oa.base_url", "value": "http://127.0.0.1:1/v1"},
		{"prop": "agents.oa.api_key", "value": "sk-never-sent-0123456789"},
	}})
	// The session service follows the config service's revisions over
	// the bus: a session/new right after the set may come before it
	// knows the agent (seen in CI: "Unknown agent_alias").
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error { return agentServed(v.c, "oa") })
	id := v.newSession("oa")
	cfg := s.PIDOf("config")
	if cfg == 0 {
		t.Fatalf("no config among %v", s.PIDs())
	}
	resume := hang(t, cfg)
	defer resume()

	began := time.Now()
	ups, resp := v.until(v.send("session/prompt", map[string]any{"session_id": id, "prompt": "hi"}))
	took := time.Since(began)
	t.Logf("the prompt answered after %v with the config service hung", took.Round(time.Millisecond))
	if resp.Error != nil {
		t.Fatalf("prompt: %v", resp.Error)
	}
	var pr struct{ Outcome, Content string }
	if err := json.Unmarshal(resp.Result, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Outcome != "failed" || !strings.Contains(pr.Content, "the config service did not answer within") {
		t.Fatalf("prompt with the config service hung: %s (updates %d)", resp.Result, len(ups))
	}
}
