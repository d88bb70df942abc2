package session

import (
	"github.com/clawmesh/clawmesh/services/session/provider"
)

// Provider names of agents.<alias>.provider.
const (
	ProviderScripted = provider.Scripted
	ProviderOpenAI   = provider.OpenAI
)

// DefaultOpenAIBaseURL is used when agents.<alias>.base_url is empty.
const DefaultOpenAIBaseURL = provider.DefaultOpenAIBaseURL

// The provider contract, defined in package provider; the aliases let
// callers of this package (tests, extra providers given in Config) name
// them without importing it.
type (
	Provider        = provider.Provider
	ProviderRequest = provider.Request
	ChatMessage     = provider.Message
	ToolSpec        = provider.ToolSpec
	ToolCall        = provider.ToolCall
	Chunk           = provider.Chunk
	StepResult      = provider.StepResult
)

// ProviderFactory builds a provider for an agent.
type ProviderFactory func(AgentConfig) (Provider, error)

// defaultProviders are the providers every server knows.
func defaultProviders() map[string]ProviderFactory {
	return map[string]ProviderFactory{
		ProviderScripted: func(AgentConfig) (Provider, error) { return provider.ScriptedProvider{}, nil },
		ProviderOpenAI:   func(a AgentConfig) (Provider, error) { return provider.NewOpenAI(a.providerAgent()) },
	}
}

// providerAgent is what a provider is told of the agent.
func (a AgentConfig) providerAgent() provider.Agent {
	return provider.Agent{Alias: a.Alias, Model: a.Model, BaseURL: a.BaseURL, APIKey: a.APIKey, Timeout: a.Timeout}
}
