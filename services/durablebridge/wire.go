package durablebridge

import (
	"encoding/json"
	"time"
)

// The JSON of the durable wire, as ../shared/WIRE.md fixes it: camelCase
// names, times in ISO 8601 with a zone.

// ProtocolVersion is the one wire version this bridge speaks.
const ProtocolVersion = 1

// ServiceName is hello's service field; Collie talks to nothing else.
const ServiceName = "collie-durable"

// Limits of seed 004 on what one snapshot, pane or response holds.
const (
	maxWorkspaces    = 64
	maxTabs          = 256
	maxPanes         = 256
	maxAsksPerPane   = 50
	maxStarters      = 50
	maxActions       = 4
	maxActionLabel   = 16
	maxIDLen         = 128
	maxBody          = 64 << 10
	maxEventsPerPage = 1000
	maxViewItems     = 2000
	maxHistoryPage   = 100
	maxItemsPage     = 1000
	maxCursor        = 512

	limitHello         = 16 << 10
	limitSnapshot      = 4 << 20
	limitEvents        = 8 << 20
	limitConversations = 1 << 20
	limitItems         = 8 << 20
	limitPost          = 16 << 10
)

// Error codes of WIRE.md.
const (
	codeVersionRequired   = "version-required"
	codeBadID             = "bad-id"
	codeBadRequest        = "bad-request"
	codeUnauthorized      = "unauthorized"
	codeCallerRefused     = "caller-refused"
	codeNotFound          = "not-found"
	codeNoSuchPane        = "no-such-pane"
	codeNoSuchStarter     = "no-such-starter"
	codeNoSuchConv        = "no-such-conversation"
	codeNoSuchTab         = "no-such-tab"
	codeNoSuchWorkspace   = "no-such-workspace"
	codeStale             = "stale"
	codeDecided           = "decided"
	codeRequestIDReused   = "request-id-reused"
	codeTurnChanged       = "turn-changed"
	codeIncompatible      = "incompatible"
	codeTooLarge          = "too-large"
	codeStarting          = "starting"
	codeTooLate           = "too-late"
	codeUnavailable       = "unavailable"
	codeQueueFull         = "queue-full"
	codeConversationEnded = "conversation-ended"
)

// Who closed an ask.
const (
	byPhone   = "phone"
	byProgram = "program"
	byTimeout = "timeout"
)

// Options of a permission ask.
const (
	optAllowOnce   = "allow_once"
	optAllowAlways = "allow_always"
	optReject      = "reject"
)

// Pane states.
const (
	stateIdle    = "idle"
	stateRunning = "running"
	stateWaiting = "waiting"
)

// Item kinds.
const (
	kindUser     = "user"
	kindReply    = "reply"
	kindThinking = "thinking"
	kindNotice   = "notice"
	kindTool     = "tool"
)

type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

type versionRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

type wireHello struct {
	Service  string          `json:"service"`
	Protocol versionRange    `json:"protocol"`
	Host     wireHost        `json:"host"`
	Epoch    string          `json:"epoch"`
	Ready    bool            `json:"ready"`
	Caps     map[string]bool `json:"caps"`
}

type wireHost struct {
	Name string `json:"name"`
}

type wireRefusal struct {
	Code    string `json:"code"`
	Refusal struct {
		Agent  versionRange `json:"agent"`
		Collie versionRange `json:"collie"`
	} `json:"refusal"`
}

type wireSnapshot struct {
	Epoch      string          `json:"epoch"`
	Rev        int64           `json:"rev"`
	Workspaces []wireWorkspace `json:"workspaces"`
	Starters   []wireStarter   `json:"starters"`
}

type wireWorkspace struct {
	ID    string    `json:"id"`
	Title string    `json:"title"`
	Tabs  []wireTab `json:"tabs"`
}

type wireTab struct {
	ID    string     `json:"id"`
	Title string     `json:"title"`
	Panes []wirePane `json:"panes"`
}

type wirePane struct {
	ID      string       `json:"id"`
	Title   string       `json:"title"`
	State   string       `json:"state"`
	Turn    *wireTurn    `json:"turn"`
	Asks    []wireAsk    `json:"asks"`
	Actions []wireAction `json:"actions"`
}

type wireTurn struct {
	ID        string `json:"id"`
	StartedAt string `json:"startedAt"`
}

type wireAction struct {
	ID    string `json:"id"`
	Label string `json:"label"`
}

type wireStarter struct {
	ID          string `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description"`
}

type wireAsk struct {
	ID        string       `json:"id"`
	Kind      string       `json:"kind"`
	Revision  int64        `json:"revision"`
	Title     string       `json:"title"`
	Body      string       `json:"body"`
	Tool      *wireTool    `json:"tool,omitempty"`
	Options   []wireOption `json:"options"`
	ExpiresAt string       `json:"expiresAt,omitempty"`
}

type wireTool struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

type wireOption struct {
	ID    string `json:"id"`
	Label string `json:"label"`
}

type wireItem struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Text string `json:"text"`
	At   string `json:"at"`
}

// wireOutcome mirrors the answer that decided an ask.
type wireOutcome struct {
	Option string `json:"option"`
}

type wireEvent struct {
	Seq     int64        `json:"seq"`
	Type    string       `json:"type"`
	Item    *wireItem    `json:"item,omitempty"`
	Ask     *wireAsk     `json:"ask,omitempty"`
	AskID   string       `json:"askId,omitempty"`
	By      string       `json:"by,omitempty"`
	Outcome *wireOutcome `json:"outcome,omitempty"`
	// Turn is set on turn events only, where null means idle.
	Turn  json.RawMessage `json:"turn,omitempty"`
	State string          `json:"state,omitempty"`
}

type wireConversation struct {
	ID        string `json:"id"`
	Title     string `json:"title"`
	Open      bool   `json:"open"`
	Pane      string `json:"pane,omitempty"`
	UpdatedAt string `json:"updatedAt"`
}

// stamp formats a time for the wire.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// validID reports whether s is an id of the wire: 1 to 128 bytes, no
// control characters, no white space, none of / ? #.
func validID(s string) bool {
	if len(s) == 0 || len(s) > maxIDLen {
		return false
	}
	for _, r := range s {
		switch {
		case r == '/' || r == '?' || r == '#':
			return false
		case r <= ' ' || r == 0x7f || r == 0x85 || r == 0xa0:
			return false
		case r >= 0x80 && (hidden(r) || isSpace(r)):
			return false
		case r == 0xfffd:
			return false
		}
	}
	return true
}

func isSpace(r rune) bool {
	switch r {
	case 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// validCursor reports whether s is a history cursor: at most 512 bytes of
// printable ASCII without spaces.
func validCursor(s string) bool {
	if len(s) == 0 || len(s) > maxCursor {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
