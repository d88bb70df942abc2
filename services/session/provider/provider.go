// Package provider holds what a turn of the session service talks to: the
// Provider interface, the offline scripted provider and the provider for
// OpenAI-compatible chat completions endpoints.
//
// The OpenAI-compatible provider is a small hand-written client (one POST,
// a server-sent events reader that follows the SSE specification, see
// sse.go) rather than the official openai-go client: it serves one
// endpoint, it must stream every delta the moment it arrives and bound the
// wait for each one, it must accept whatever OpenAI-compatible servers
// send (reasoning deltas, error events, servers that need no key), and
// openai-go would add a large dependency tree for that one endpoint.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Names of agents.<alias>.provider.
const (
	Scripted = "scripted"
	OpenAI   = "openai"
)

// Roles of a Message.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Stop reasons a provider reports for a step.
const (
	StopEndTurn = "end_turn"
	StopToolUse = "tool_use"
)

// ErrProvider is wrapped by every provider failure (HTTP status, bad
// stream, timeout, a scripted /fail); the error's text is what the client
// sees as the failed turn's message.
var ErrProvider = errors.New("provider failed")

// Message is one message of the context sent to a provider.
type Message struct {
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

// MaxToolCalls and MaxToolCallBytes bound the tool calls of one step,
// their ids, names and arguments together: far past what a model asks
// for (an output of 1 MiB is some 250k tokens), and what a call's
// arguments may be in its tool_call update, escaped as a string when
// they are not JSON, within one bus message. A step past them fails: a
// model in a loop or a hostile endpoint cannot grow them without end.
const (
	MaxToolCalls     = 128
	MaxToolCallBytes = 1 << 20
)

// ToolCall is a call the provider asks for. ID is the provider's own id;
// Arguments is the JSON text the provider produced.
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

// Agent is what a provider needs to know of the agent it serves.
type Agent struct {
	Alias   string
	Model   string
	BaseURL string
	APIKey  string
	// Timeout bounds the wait for the response and for each streamed
	// piece after it.
	Timeout time.Duration
}

// Request is one step's input.
type Request struct {
	Agent    Agent
	Messages []Message
	Tools    []ToolSpec
}

// Provider runs one step of a turn: it streams output through emit as it
// arrives, in order, from the calling goroutine, and returns when the
// provider stops. It must return promptly once ctx is done; an error
// other than ctx's fails the turn with the error's text.
type Provider interface {
	Step(ctx context.Context, req Request, emit func(Chunk)) (StepResult, error)
}

// Error is a provider's failure; its text is what the client sees.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// Unwrap makes every Error match ErrProvider.
func (e *Error) Unwrap() error { return ErrProvider }

// Errorf builds an Error.
func Errorf(format string, args ...any) error {
	return &Error{Msg: fmt.Sprintf(format, args...)}
}
