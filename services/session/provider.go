package session

import (
	"context"
	"encoding/json"
	"fmt"
)

// Provider names of agents.<alias>.provider.
const (
	ProviderScripted = "scripted"
	ProviderOpenAI   = "openai"
)

// ChatMessage is one message of the context sent to a provider.
type ChatMessage struct {
	// Role is system, user, assistant or tool.
	Role    string
	Content string
	// ToolCalls are an assistant message's calls.
	ToolCalls []ToolCall
	// ToolCallID and Name identify the call a tool message answers.
	ToolCallID string
	Name       string
}

// ToolSpec is a tool offered to the provider.
type ToolSpec struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments.
	Parameters json.RawMessage
}

// ToolCall is a call the provider asks for. ID is the provider's own id
// (may be empty); Arguments is the JSON text the provider produced.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// Chunk is a piece of streamed output: message text, or thinking when
// Thought is set.
type Chunk struct {
	Thought bool
	Text    string
}

// StepResult is how one provider step ended: the calls it asks for (none
// means the turn is done) and the provider's stop reason.
type StepResult struct {
	ToolCalls  []ToolCall
	StopReason string
}

// ProviderRequest is one step's input.
type ProviderRequest struct {
	Agent    AgentConfig
	Messages []ChatMessage
	Tools    []ToolSpec
}

// Provider runs one step of a turn: it streams output through emit as it
// arrives, in order, from the calling goroutine, and returns when the
// provider stops. It must return promptly once ctx is done; an error
// other than ctx's fails the turn with the error's text.
type Provider interface {
	Step(ctx context.Context, req ProviderRequest, emit func(Chunk)) (StepResult, error)
}

// ProviderFactory builds a provider for an agent.
type ProviderFactory func(AgentConfig) (Provider, error)

// defaultProviders are the providers every server knows.
func defaultProviders() map[string]ProviderFactory {
	return map[string]ProviderFactory{
		ProviderScripted: func(AgentConfig) (Provider, error) { return scripted{}, nil },
		ProviderOpenAI:   newOpenAI,
	}
}

// providerError is a provider's failure; its text is what the client sees
// as the failed turn's message.
type providerError struct{ msg string }

func (e *providerError) Error() string { return e.msg }
func (e *providerError) Unwrap() error { return ErrProvider }

func providerErrorf(format string, args ...any) error {
	return &providerError{msg: fmt.Sprintf(format, args...)}
}
