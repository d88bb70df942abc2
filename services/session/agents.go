package session

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configclient"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// DefaultAgentAlias is the agent that exists out of the box.
const DefaultAgentAlias = "default"

// AgentConfig is one agents.<alias> entry of the config document, as
// configclient reads it, with the secret the session service reveals.
type AgentConfig struct {
	configclient.Agent
	// APIKey is agents.<alias>.api_key, revealed for an openai agent.
	APIKey string
}

// DefaultAgent is the built-in default agent: the scripted provider, no
// tool needing approval.
func DefaultAgent() AgentConfig {
	return AgentConfig{Agent: configclient.Agent{Alias: DefaultAgentAlias, Provider: ProviderScripted}}.withDefaults()
}

// withDefaults fills what a caller left unset (tests and StaticAgents
// build agents by hand) with the schema's defaults, as configclient does.
func (a AgentConfig) withDefaults() AgentConfig {
	d := configclient.AgentDefaults()
	if a.ApprovalTimeout <= 0 {
		a.ApprovalTimeout = d.ApprovalTimeout
	}
	if a.Timeout <= 0 {
		a.Timeout = d.Timeout
	}
	if a.StepTimeout <= 0 {
		a.StepTimeout = d.StepTimeout
	}
	if a.ContextBudgetTokens <= 0 {
		a.ContextBudgetTokens = d.ContextBudgetTokens
	}
	return a
}

func (a AgentConfig) needsApproval(tool string) bool {
	for _, t := range a.ApprovalRequired {
		if t == tool || t == "*" {
			return true
		}
	}
	return false
}

func (a AgentConfig) offers(tool string) bool {
	if len(a.Tools) == 0 {
		return true
	}
	for _, t := range a.Tools {
		if t == tool {
			return true
		}
	}
	return false
}

// AgentSource resolves an agent alias to its settings. Agent returns an
// error wrapping ErrUnknownAgent when the alias is not configured.
type AgentSource interface {
	Agent(ctx context.Context, alias string) (AgentConfig, error)
}

// StaticAgents is an in-memory AgentSource, for tests and demos. The
// default agent exists unless the map overrides it.
type StaticAgents struct {
	mu     sync.RWMutex
	agents map[string]AgentConfig
}

// NewStaticAgents builds a source holding agents (and the default one).
func NewStaticAgents(agents ...AgentConfig) *StaticAgents {
	s := &StaticAgents{agents: map[string]AgentConfig{DefaultAgentAlias: DefaultAgent()}}
	for _, a := range agents {
		s.Set(a)
	}
	return s
}

// Set adds or replaces one agent.
func (s *StaticAgents) Set(a AgentConfig) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.agents[a.Alias] = a.withDefaults()
}

// Agent implements AgentSource.
func (s *StaticAgents) Agent(_ context.Context, alias string) (AgentConfig, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	a, ok := s.agents[alias]
	if !ok {
		return AgentConfig{}, fmt.Errorf("%w: %s", ErrUnknownAgent, alias)
	}
	return a, nil
}

// ConfigAgents reads agents from the config service: Live for the masked
// document (agents.<alias>.*), Reveal for agents.<alias>.api_key. It asks
// on every call, so a turn always runs with the config in force when it
// starts; the config service answers from memory.
type ConfigAgents struct {
	// Live is the config the service follows (a configclient.Client): the
	// agents are read from its current document, with no call per turn.
	Live interface{ Current() configclient.Snapshot }
	// Client reveals an openai agent's api_key, which Live only has masked.
	Client configv1.ConfigServiceClient
	Log    *zap.Logger
}

// AtLeast waits, bounded, until the live config read is at revision rev
// or later (configclient.Client.AtLeast); a Live that cannot be asked
// returns at once.
func (c *ConfigAgents) AtLeast(ctx context.Context, rev int64) error {
	if w, ok := c.Live.(interface {
		AtLeast(ctx context.Context, rev int64) error
	}); ok {
		return w.AtLeast(ctx, rev)
	}
	return nil
}

// Latest waits, bounded, until the live config read is the one the
// config service serves now, or later (configclient.Client.Latest); a
// Live that cannot be asked returns at once.
func (c *ConfigAgents) Latest(ctx context.Context) error {
	if w, ok := c.Live.(interface {
		Latest(ctx context.Context) error
	}); ok {
		return w.Latest(ctx)
	}
	return nil
}

// Agent implements AgentSource.
func (c *ConfigAgents) Agent(ctx context.Context, alias string) (AgentConfig, error) {
	entry, found := c.Live.Current().Agent(alias)
	if !found {
		if alias == DefaultAgentAlias {
			return DefaultAgent(), nil
		}
		return AgentConfig{}, fmt.Errorf("%w: %s", ErrUnknownAgent, alias)
	}
	a := AgentConfig{Agent: entry}.withDefaults()
	if a.Provider == ProviderOpenAI {
		// Bounded: a turn's context has no deadline, and with the config
		// service hung the turn waited out the connection's keepalive.
		rctx, cancel := configclient.Bounded(ctx)
		rev, err := c.Client.Reveal(rctx, &configv1.RevealRequest{Prop: "agents." + alias + ".api_key"})
		err = configclient.NoAnswer(rctx, err)
		cancel()
		switch {
		case status.Code(err) == codes.Unimplemented || status.Code(err) == codes.NotFound:
			// No key to reveal: local OpenAI-compatible servers need none.
			c.Log.Warn("api_key not revealed, calling without one", zap.String("agent_alias", alias), zap.Error(err))
		case err != nil:
			return AgentConfig{}, fmt.Errorf("config service: reveal api_key: %w", err)
		case rev.GetFound():
			a.APIKey = rev.GetValue().GetStringValue()
		}
	}
	return a, nil
}
