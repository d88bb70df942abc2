package abi

import (
	"crypto/sha256"
	"encoding/hex"
)

// Version is the ABI version. A guest exports it from clawmesh_abi_version;
// the host refuses a module that answers anything else.
const Version = 1

// HostModule is the import module name of every Clawmesh host import.
const HostModule = "clawmesh"

// Result codes returned by host imports. A non-negative result is a length.
const (
	// CodeAccessDenied: the grant is missing (config_read, http_client), or
	// the world does not include the import.
	CodeAccessDenied int64 = -1
	// CodeNotFound: no such secret property.
	CodeNotFound int64 = -2
	// CodeUnavailable: outside a service frame, a resolver or network
	// failure, or the per-frame host-call budget spent.
	CodeUnavailable int64 = -3
	// CodeInvalidArgument: a malformed request.
	CodeInvalidArgument int64 = -4
	// CodeTooLarge: the response exceeds the host's cap.
	CodeTooLarge int64 = -5
)

// MaxHostCallsPerFrame is the fixed budget of Clawmesh imports one service
// frame (one export call) may make. When it is spent, logging does nothing,
// inbound polling reports empty, and config, secret and HTTP calls return
// CodeUnavailable. A new frame resets it.
const MaxHostCallsPerFrame = 1024

// Core exports, required in every world.
const (
	ExportABIVersion = "clawmesh_abi_version"
	ExportAlloc      = "alloc"
	ExportDealloc    = "dealloc"
	// ExportInitialize is the reactor initialiser, run once per instance.
	ExportInitialize = "_initialize"
)

// Host imports of module HostModule.
const (
	ImportLogRecord      = "log_record"
	ImportSecretsGet     = "secrets_get"
	ImportConfigGet      = "config_get"
	ImportInboundPoll    = "inbound_poll"
	ImportInboundPending = "inbound_pending"
	ImportHTTPRequest    = "http_request"
	ImportHTTPResponse   = "http_response"
	// ImportFuelLeft answers in every world, in a frame or not: it is no
	// capability, only what the call can still spend.
	ImportFuelLeft = "fuel_left"
)

// Imports lists every host import.
var Imports = []string{
	ImportLogRecord, ImportSecretsGet, ImportConfigGet, ImportInboundPoll,
	ImportInboundPending, ImportHTTPRequest, ImportHTTPResponse, ImportFuelLeft,
}

// World names a plugin world.
type World string

// Worlds. Observer is Clawmesh's core-wasm rendering of seed 003's
// observability backend.
const (
	WorldTool     World = "tool"
	WorldChannel  World = "channel"
	WorldMemory   World = "memory"
	WorldObserver World = "observer"
)

// Tool world exports.
const (
	ExportToolName             = "tool_name"
	ExportToolDescription      = "tool_description"
	ExportToolParametersSchema = "tool_parameters_schema"
	ExportToolExecute          = "tool_execute"
)

// Channel world exports.
const (
	ExportChannelName         = "channel_name"
	ExportChannelCapabilities = "channel_capabilities"
	ExportChannelConfigure    = "channel_configure"
	ExportChannelSend         = "channel_send"
	ExportChannelPollMessage  = "channel_poll_message"
	ExportChannelHealth       = "channel_health"
	ExportChannelStartTyping  = "channel_start_typing"
	ExportChannelStopTyping   = "channel_stop_typing"
	// ExportChannelPollRefused is optional: the host calls it only on a
	// plugin that advertises FlagPollRefused, which must then export it.
	// Plugins built before it existed have neither and load as before;
	// it is therefore not in WorldExports.
	ExportChannelPollRefused = "channel_poll_refused"
)

// Memory world exports.
const (
	ExportMemoryName         = "memory_name"
	ExportMemoryCapabilities = "memory_capabilities"
	ExportMemoryStore        = "memory_store"
	ExportMemoryRecall       = "memory_recall"
	ExportMemoryForget       = "memory_forget"
	ExportMemoryCount        = "memory_count"
)

// Observer world exports.
const (
	ExportObserverName        = "observer_name"
	ExportObserverRecordEvent = "observer_record_event"
	ExportObserverFlush       = "observer_flush"
)

// WorldExports are the exports each world requires, besides the core ones.
var WorldExports = map[World][]string{
	WorldTool: {ExportToolName, ExportToolDescription, ExportToolParametersSchema, ExportToolExecute},
	WorldChannel: {ExportChannelName, ExportChannelCapabilities, ExportChannelConfigure, ExportChannelSend,
		ExportChannelPollMessage, ExportChannelHealth, ExportChannelStartTyping, ExportChannelStopTyping},
	WorldMemory: {ExportMemoryName, ExportMemoryCapabilities, ExportMemoryStore, ExportMemoryRecall,
		ExportMemoryForget, ExportMemoryCount},
	WorldObserver: {ExportObserverName, ExportObserverRecordEvent, ExportObserverFlush},
}

// WorldImports are the host imports each world includes, as seed 003 lists
// them: every world has logging; tool adds secrets; channel adds config,
// secrets and inbound; tool and channel add outbound HTTP when the
// http_client grant is effective. A module may import the rest (one Go
// module can export several worlds), but in a world that does not include
// an import the host answers CodeAccessDenied (inbound: empty).
var WorldImports = map[World][]string{
	WorldTool:     {ImportLogRecord, ImportSecretsGet, ImportHTTPRequest, ImportHTTPResponse},
	WorldChannel:  {ImportLogRecord, ImportConfigGet, ImportSecretsGet, ImportInboundPoll, ImportInboundPending, ImportHTTPRequest, ImportHTTPResponse},
	WorldMemory:   {ImportLogRecord},
	WorldObserver: {ImportLogRecord},
}

// WorldHasImport reports whether world w includes import name.
func WorldHasImport(w World, name string) bool {
	for _, n := range WorldImports[w] {
		if n == name {
			return true
		}
	}
	return false
}

// Capability flags advertised by the *_capabilities exports.
const (
	FlagHealth = "health"
	FlagTyping = "typing"
	FlagCount  = "count"
	// FlagPollRefused: the channel takes channel_poll_refused, by which
	// the host tells it that the message its last poll answered was
	// refused. Without it the host has no way to: a plugin that answers
	// the message again stalls its channel.
	FlagPollRefused = "poll_refused"
)

// Log levels of log_record.
const (
	LevelTrace uint32 = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

// LevelNames are the level names, indexed by level.
var LevelNames = []string{"trace", "debug", "info", "warn", "error"}

// LogActions and LogOutcomes are the closed taxonomies of a log event's
// action and outcome. There is deliberately no escape variant: the host
// drops a record naming anything else.
var (
	LogActions  = []string{"execute", "request", "send", "receive", "poll", "configure", "store", "recall", "forget", "health"}
	LogOutcomes = []string{"started", "success", "failure", "denied", "timeout"}
)

// Logging limits.
const (
	// MaxLogRecordBytes: a record with more guest bytes is dropped, not
	// truncated.
	MaxLogRecordBytes = 64 << 10
	// LogBudgetBytes: the aggregate guest bytes the host queues; freed only
	// after a record is written.
	LogBudgetBytes = 8 << 20
)

// InstanceKey derives the versioned zpi1_ key of a plugin instance from the
// package, the capability and the binding, so different packages and
// scopes can reuse aliases such as "main" safely.
func InstanceKey(pkg string, world World, binding string) string {
	if binding == "" {
		binding = "default"
	}
	sum := sha256.Sum256([]byte(pkg + "\x00" + string(world) + "\x00" + binding))
	return "zpi1_" + hex.EncodeToString(sum[:12])
}
