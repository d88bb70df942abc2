package abi

// The JSON shapes that cross the boundary. A WIT result<T, E> travels as
// the envelope {"ok": T} or {"err": E}; an option<T> as T or null.

// LogEvent is the argument of log_record.
type LogEvent struct {
	Action  string            `json:"action"`
	Outcome string            `json:"outcome"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// ToolResult is the tool-result record: the ok value of tool_execute.
type ToolResult struct {
	Success bool    `json:"success"`
	Output  string  `json:"output"`
	Error   *string `json:"error"`
}

// ToolEnvelope is tool_execute's result<tool-result, string>.
type ToolEnvelope struct {
	Ok  *ToolResult `json:"ok,omitempty"`
	Err *string     `json:"err,omitempty"`
}

// ChannelMessage is the ok value of channel_poll_message (or null).
type ChannelMessage struct {
	ID          string `json:"id"`
	Sender      string `json:"sender"`
	ReplyTarget string `json:"reply_target,omitempty"`
	Content     string `json:"content"`
	ThreadID    string `json:"thread_id,omitempty"`
	Timestamp   int64  `json:"timestamp,omitempty"`
}

// PollRefusal is the argument of channel_poll_refused: the host refused
// the message the plugin's poll just answered for its size, and will not
// take it answered again. Field is the first string past its bound
// ("content", or "id", "sender", "reply_target", "thread_id" past 16
// KiB), Bytes its length and Bound the bound. The message's other
// strings are given as far as they were within their own bounds (one
// past it is empty), so that the plugin can tell which it was; its
// content never.
type PollRefusal struct {
	ID          string `json:"id"`
	Sender      string `json:"sender"`
	ReplyTarget string `json:"reply_target,omitempty"`
	ThreadID    string `json:"thread_id,omitempty"`
	Timestamp   int64  `json:"timestamp,omitempty"`
	Field       string `json:"field"`
	Bytes       int    `json:"bytes"`
	Bound       int    `json:"bound"`
}

// SendMessage is the argument of channel_send.
type SendMessage struct {
	Recipient string `json:"recipient"`
	Content   string `json:"content"`
	ThreadID  string `json:"thread_id,omitempty"`
}

// TypingArgs is the argument of channel_start_typing and
// channel_stop_typing.
type TypingArgs struct {
	Recipient string `json:"recipient"`
}

// MemoryEntry is the argument of memory_store and an item of
// memory_recall's ok value.
type MemoryEntry struct {
	Key       string   `json:"key"`
	Content   string   `json:"content"`
	Category  string   `json:"category,omitempty"`
	SessionID string   `json:"session_id,omitempty"`
	Timestamp int64    `json:"timestamp,omitempty"`
	Score     *float64 `json:"score,omitempty"`
}

// RecallAnswerBytes is what a memory_recall answer should keep to: the
// guest library stops adding entries, best first, once the next would
// take the answer past it, and always keeps the first. Encoding is paid in
// the plugin's fuel (the guest library's encoder about 10.5 units a byte
// of ASCII and up to about 265 a control character, which it writes as
// \u00XX; encoding/json 55 and 340), the
// host refuses results past 16 MiB, and the session keeps 1 MiB of a
// tool's output (what it takes of a recall).
const RecallAnswerBytes = 1 << 20

// RecallArgs is the argument of memory_recall.
type RecallArgs struct {
	Query string `json:"query"`
	Limit int    `json:"limit"`
}

// ForgetArgs is the argument of memory_forget.
type ForgetArgs struct {
	Key string `json:"key"`
}

// ObserverEvent is the argument of observer_record_event: one event of the
// host's (a tool call, a channel message, a plugin load), with string
// fields only.
type ObserverEvent struct {
	// Kind is one of the ObserverKind values.
	Kind string `json:"kind"`
	// Timestamp is Unix milliseconds.
	Timestamp int64             `json:"timestamp"`
	Fields    map[string]string `json:"fields,omitempty"`
}

// Observer event kinds.
const (
	ObserverToolCall        = "tool_call"
	ObserverChannelReceived = "channel_received"
	ObserverChannelSent     = "channel_sent"
	ObserverPluginLoaded    = "plugin_loaded"
	ObserverPluginUnloaded  = "plugin_unloaded"
)

// HTTPRequest is the argument of http_request. Body travels base64-encoded
// (encoding/json's []byte).
type HTTPRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
	// TimeoutMS may shorten, never extend, the host's deadline.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// HTTPResponse is what http_response copies out.
type HTTPResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
}
