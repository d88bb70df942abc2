package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/jsonwalk"
)

// DefaultOpenAIBaseURL is used when agents.<alias>.base_url is empty.
const DefaultOpenAIBaseURL = "https://api.openai.com/v1"

// openAIClient is shared by every openai provider: no overall timeout
// (responses stream for as long as the model writes); the agent's timeout
// bounds the wait for each piece instead.
var openAIClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

// openAI talks to any OpenAI-compatible chat completions endpoint,
// streaming over server-sent events, with tool calling.
type openAI struct {
	url, model, apiKey string
	timeout            time.Duration
}

// NewOpenAI builds the provider of an agent whose provider is openai:
// agents.<alias>.model is required, base_url defaults to
// DefaultOpenAIBaseURL.
func NewOpenAI(a Agent) (Provider, error) {
	if a.Model == "" {
		return nil, Errorf("Agent `%s` uses the openai provider but agents.%s.model is not set", a.Alias, a.Alias)
	}
	base := a.BaseURL
	if base == "" {
		base = DefaultOpenAIBaseURL
	}
	return &openAI{url: strings.TrimRight(base, "/") + "/chat/completions", model: a.Model, apiKey: a.APIKey, timeout: a.Timeout}, nil
}

// Wire shapes of the chat completions API.
type (
	oaMessage struct {
		Role       string       `json:"role"`
		Content    *string      `json:"content"`
		ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
		ToolCallID string       `json:"tool_call_id,omitempty"`
		Name       string       `json:"name,omitempty"`
	}
	oaToolCall struct {
		Index    *int   `json:"index,omitempty"`
		ID       string `json:"id,omitempty"`
		Type     string `json:"type,omitempty"`
		Function struct {
			Name      string `json:"name,omitempty"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	oaTool struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description,omitempty"`
			Parameters  json.RawMessage `json:"parameters,omitempty"`
		} `json:"function"`
	}
	oaRequest struct {
		Model    string      `json:"model"`
		Messages []oaMessage `json:"messages"`
		Tools    []oaTool    `json:"tools,omitempty"`
		Stream   bool        `json:"stream"`
	}
	oaChunk struct {
		Choices []struct {
			Delta struct {
				Content          string       `json:"content"`
				ReasoningContent string       `json:"reasoning_content"`
				Reasoning        string       `json:"reasoning"`
				ToolCalls        []oaToolCall `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Error *oaError `json:"error"`
	}
	oaError struct {
		Message string `json:"message"`
	}
)

var errIdle = errors.New("provider idle")

// eventDecoder decodes each event's data of one stream as json.Unmarshal
// does, through one json.Decoder fed the events one after another:
// Unmarshal makes its decoder's state anew every call (the state, its
// error context and field stack, the scanner's stack), seven
// allocations an event of OpenAI's shape, which the Decoder keeps from
// one value to the next.
type eventDecoder struct {
	src eventSource
	dec *json.Decoder
	fed int64 // bytes given to src, all events so far
}

// eventSource hands the decoder the event being decoded, then io.EOF.
type eventSource struct{ b []byte }

func (s *eventSource) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// decode decodes data, one event's, into c (reuse made zero but for its
// array) as json.Unmarshal would. The Decoder takes one value and
// leaves what follows it: data must hold one value and JSON white space
// around it, as Unmarshal wants. Anything the Decoder refuses, or data
// with more after its value, is decoded again by Unmarshal itself, whose
// error (and partial result) the caller gets, as before; the Decoder,
// out of step with the events then, is made anew.
func (d *eventDecoder) decode(data []byte, c *oaChunk) error {
	c.reuse()
	if d.dec == nil {
		d.dec = json.NewDecoder(&d.src)
		d.fed = 0
	}
	d.src.b = data
	d.fed += int64(len(data))
	if d.dec.Decode(c) == nil {
		// What the Decoder has not consumed is the end of data (what
		// came before its value, earlier events' white space, it has).
		if rest := d.fed - d.dec.InputOffset(); rest >= 0 && rest <= int64(len(data)) && jsonSpace(data[len(data)-int(rest):]) {
			return nil
		}
	}
	d.dec = nil
	c.reuse()
	return json.Unmarshal(data, c)
}

// jsonSpace reports whether b is JSON white space only.
func jsonSpace(b []byte) bool {
	for _, ch := range b {
		if !jsonwalk.IsSpace(ch) {
			return false
		}
	}
	return true
}

// maxReusedChoices bounds the choices' array an oaChunk keeps from one
// event to the next: a stream has one choice, as the request asks for.
const maxReusedChoices = 8

// reuse makes c a zero oaChunk before an event is decoded into it, but
// for the array of its choices: encoding/json decodes a JSON array into
// a slice's array, so an event's one choice costs no allocation of its
// own. The elements are zeroed first (encoding/json decodes into them
// as they are, and a field an event lacks would keep the last one's),
// so the decoded chunk is the one a new oaChunk would be.
func (c *oaChunk) reuse() {
	choices := c.Choices[:cap(c.Choices)]
	if len(choices) > maxReusedChoices {
		choices = nil
	}
	clear(choices)
	*c = oaChunk{Choices: choices[:0]}
}

func (p *openAI) Step(ctx context.Context, req Request, emit func(Chunk)) (StepResult, error) {
	body, err := json.Marshal(p.request(req))
	if err != nil {
		return StepResult{}, fmt.Errorf("encode chat request: %w", err)
	}
	// The request is cancelled with errIdle when nothing arrives for the
	// agent's timeout: first the response head, then any bytes.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := time.AfterFunc(p.timeout, func() { cancel(errIdle) })
	defer idle.Stop()
	timedOut := func(err error) error {
		if ctx.Err() == nil && errors.Is(context.Cause(rctx), errIdle) {
			return Errorf("openai provider: no response from %s within %s", p.url, p.timeout)
		}
		return err
	}

	hreq, err := http.NewRequestWithContext(rctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return StepResult{}, Errorf("openai provider: bad base_url: %v", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if p.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := openAIClient.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return StepResult{}, ctx.Err()
		}
		return StepResult{}, timedOut(Errorf("openai provider: request to %s failed: %v", p.url, unwrapURLError(err)))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return StepResult{}, timedOut(httpFailure(resp))
	}
	idle.Reset(p.timeout)

	// Tool calls arrive in pieces, each delta naming its call by index:
	// gathered in builders (a string grown by += copies every piece before
	// it, quadratic in the pieces), at most MaxToolCalls of them and
	// MaxToolCallBytes in all.
	calls := map[int]*callParts{}
	callBytes := 0
	var finish string
	// Any byte that arrives (a keep-alive comment too) is progress.
	events := NewSSEReader(progressReader{r: resp.Body, progress: func() { idle.Reset(p.timeout) }}, DefaultMaxEventBytes)
	done := false
	// c is decoded into again for every event, its choices' array
	// reused, zeroed first (see reuse).
	var c oaChunk
	var dec eventDecoder
	for !done {
		// The event's bytes, decoded where the reader holds them.
		typ, data, err := events.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return StepResult{}, ctx.Err()
			}
			return StepResult{}, timedOut(Errorf("openai provider: reading the stream failed: %v", err))
		}
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			done = true
			break
		}
		if err := dec.decode(data, &c); err != nil {
			if string(typ) == "error" {
				// Some compatible servers name an error event and send its
				// text as it is.
				return StepResult{}, Errorf("openai provider: %s", strings.TrimSpace(string(data)))
			}
			return StepResult{}, Errorf("openai provider: malformed stream event: %v", err)
		}
		if c.Error != nil {
			return StepResult{}, Errorf("openai provider: %s", c.Error.Message)
		}
		for _, ch := range c.Choices {
			if t := ch.Delta.ReasoningContent + ch.Delta.Reasoning; t != "" {
				emit(Chunk{Thought: true, Text: t})
			}
			if ch.Delta.Content != "" {
				emit(Chunk{Text: ch.Delta.Content})
			}
			for i, tc := range ch.Delta.ToolCalls {
				idx := i
				if tc.Index != nil {
					idx = *tc.Index
				}
				call := calls[idx]
				if call == nil {
					if len(calls) == MaxToolCalls {
						return StepResult{}, Errorf("openai provider: the model asked for more than %d tool calls in one step", MaxToolCalls)
					}
					call = &callParts{}
					calls[idx] = call
				}
				if callBytes += len(tc.ID) + len(tc.Function.Name) + len(tc.Function.Arguments); callBytes > MaxToolCallBytes {
					return StepResult{}, Errorf("openai provider: the tool calls passed %d bytes in one step", MaxToolCallBytes)
				}
				if tc.ID != "" {
					call.id = tc.ID
				}
				call.name.WriteString(tc.Function.Name)
				call.args.WriteString(tc.Function.Arguments)
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finish = *ch.FinishReason
			}
		}
	}
	if ctx.Err() != nil {
		return StepResult{}, ctx.Err()
	}
	if !done && finish == "" {
		return StepResult{}, timedOut(Errorf("openai provider: the stream ended before the response was complete"))
	}

	res := StepResult{StopReason: stopReason(finish)}
	idxs := make([]int, 0, len(calls))
	for i := range calls {
		idxs = append(idxs, i)
	}
	sort.Ints(idxs)
	for n, i := range idxs {
		p := calls[i]
		c := ToolCall{ID: p.id, Name: p.name.String(), Arguments: p.args.String()}
		if c.ID == "" {
			c.ID = "call_" + strconv.Itoa(n)
		}
		res.ToolCalls = append(res.ToolCalls, c)
	}
	return res, nil
}

// callParts gathers one streamed tool call.
type callParts struct {
	id         string
	name, args strings.Builder
}

func (p *openAI) request(req Request) oaRequest {
	out := oaRequest{Model: p.model, Stream: true}
	for _, m := range req.Messages {
		content := m.Content
		om := oaMessage{Role: m.Role, Content: &content}
		switch m.Role {
		case RoleAssistant:
			if content == "" && len(m.ToolCalls) > 0 {
				om.Content = nil
			}
			for _, c := range m.ToolCalls {
				var tc oaToolCall
				tc.ID, tc.Type = c.ID, "function"
				tc.Function.Name, tc.Function.Arguments = c.Name, c.Arguments
				om.ToolCalls = append(om.ToolCalls, tc)
			}
		case RoleTool:
			om.ToolCallID = m.ToolCallID
		}
		out.Messages = append(out.Messages, om)
	}
	for _, t := range req.Tools {
		var ot oaTool
		ot.Type = "function"
		ot.Function.Name, ot.Function.Description, ot.Function.Parameters = t.Name, t.Description, t.Parameters
		out.Tools = append(out.Tools, ot)
	}
	return out
}

func stopReason(finish string) string {
	switch finish {
	case "", "stop":
		return StopEndTurn
	case "tool_calls", "function_call":
		return StopToolUse
	case "length":
		return "max_tokens"
	}
	return finish
}

// httpFailure describes a refused request with the server's own message
// when it gives one.
func httpFailure(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	msg := ""
	if json.Unmarshal(raw, &e) == nil && len(e.Error) > 0 {
		var obj oaError
		if json.Unmarshal(e.Error, &obj) == nil && obj.Message != "" {
			msg = obj.Message
		} else {
			var s string
			if json.Unmarshal(e.Error, &s) == nil {
				msg = s
			}
		}
	}
	if msg == "" {
		msg = strings.TrimSpace(string(raw))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return Errorf("openai provider: HTTP %d: %s", resp.StatusCode, msg)
}

// unwrapURLError drops net/http's "Post URL:" prefix, the message names
// the URL already.
func unwrapURLError(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

// progressReader calls progress after every read that returned bytes.
type progressReader struct {
	r        io.Reader
	progress func()
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.progress()
	}
	return n, err
}
