package configschema

import (
	"errors"
	"net/netip"
	"regexp"
)

// Permission names, as the seeds use them: what a permission profile may
// grant and what services ask the config service about. "admin" holds
// every permission, like the operator.
const (
	PermAdmin         = "admin"
	PermConfigRead    = "Config:Read"
	PermConfigUpdate  = "Config:Update"
	PermFilesCreate   = "files:create"
	PermAgentUse      = "agent:use"
	PermSessionCreate = "session:create"
	PermSessionAdmin  = "session:admin"
	PermPluginsManage = "plugins:manage"
)

// PermStanding is no permission a profile grants: the config service
// allows it to every principal whose binding stands (a user that exists,
// its token paired or its uid still its own), and refuses it, saying why,
// to one whose binding was revoked. A service asks it where a call needs
// no permission of its own, only a principal whose authority lasts.
const PermStanding = "standing"

// Permissions lists every permission name.
var Permissions = []string{
	PermAdmin, PermConfigRead, PermConfigUpdate, PermFilesCreate, PermAgentUse,
	PermSessionCreate, PermSessionAdmin, PermPluginsManage,
}

// Providers are the values of agents.<alias>.provider: the session
// service implements each one.
var Providers = []string{"scripted", "openai"}

// Principal ids: the operator's, and a user's.
const OperatorPrincipal = "shared-operator"

// UserPrincipal is the principal id of users.<name>.
func UserPrincipal(name string) string { return "user:" + name }

// The patterns bound no length by a counted repetition: Go's regexp
// compiles x{0,256} as 256 copies of x, and the package's patterns so
// written took 4 ms to compile at every process's start (the stack's five
// and every CLI command). A length bound is the row's MaxLen.
var (
	configPathPattern = regexp.MustCompile(`^(\*|[A-Za-z0-9_][A-Za-z0-9_:@-]*)(\.(\*|[A-Za-z0-9_][A-Za-z0-9_:@-]*))*$`)
	urlPattern        = regexp.MustCompile(`^(|(https?|unix)://\S+)$`)
	toolPattern       = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]*$`) // MaxLen 128
	hexKey            = regexp.MustCompile(`^[0-9a-f]{64}$`)
	durableToken      = regexp.MustCompile(`^(|[!-~]{32,})$`)
	pluginName        = regexp.MustCompile(`^(|[a-z0-9][a-z0-9_-]*)$`) // MaxLen 64
	listenAddr        = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[0-9.]+|localhost):[0-9]{1,5}$`)
	// noControl is text on one line: no control character.
	noControl = regexp.MustCompile(`^[^\x00-\x1f]*$`)
)

// Properties is the schema. Keep related rows together; a Map row comes
// before its entries' fields.
var Properties = []Property{
	// The edge (docs/spec.md §3, §4). The gateway reads these when its listener
	// starts.
	{Path: "rpc.max_frame_bytes", Type: Integer, Default: 8388608, Min: f(1024), Max: f(1 << 30), Restart: true,
		Doc: "largest NDJSON frame (one line) in bytes"},
	{Path: "rpc.initialize_timeout_ms", Type: Integer, Default: 30000, Min: f(1), Max: f(3_600_000), Restart: true,
		Doc: "time from accept to a successful initialize"},
	{Path: "rpc.frame_timeout_ms", Type: Integer, Default: 30000, Min: f(1), Max: f(3_600_000), Restart: true,
		Doc: "time from a frame's first byte to its end"},
	{Path: "rpc.write_stall_timeout_ms", Type: Integer, Default: 30000, Min: f(1), Max: f(3_600_000), Restart: true,
		Doc: "time output may stay pending while the client does not read"},
	{Path: "rpc.max_local_connections", Type: Integer, Default: 512, Min: f(1), Max: f(65536), Restart: true,
		Doc: "open connections on the local socket"},
	{Path: "rpc.advertised_server_version", Type: String, Default: "", Pattern: noControl, MaxLen: 64, Restart: true,
		Doc: "server_version sent at initialize; empty means Clawmesh's own version"},
	{Path: "rpc.max_inflight_requests", Type: Integer, Default: 64, Min: f(1), Max: f(4096), Restart: true,
		Doc: "requests one connection may have in flight; past it the gateway stops reading that connection until replies drain"},
	{Path: "rpc.call_timeout_ms", Type: Integer, Default: 10000, Min: f(100), Max: f(3_600_000), Restart: true,
		Doc: "deadline of the gateway's short calls to a service (session/state, lists, cancel, approve, status, config reads); config writes, session/new, session/delete, session/messages, file/attach and file/upload/commit get three times it; session/prompt lasts as long as its turn"},
	{Path: "rpc.max_buffered_frame_bytes", Type: Integer, Default: 134217728, Min: f(1 << 20), Max: f(1 << 36), Restart: true,
		Doc: "unfinished frames held across every connection; a connection that would pass it waits (its frame timeout still runs)"},
	{Path: "rpc.max_buffered_output_bytes", Type: Integer, Default: 268435456, Min: f(16 << 20), Max: f(1 << 36), Restart: true,
		Doc: "output held for clients that have not read it (replies and session updates) across every connection; past it a connection holding more than 2 MiB is closed when it would queue more"},

	// Principals (docs/spec.md §4, §7).
	{Path: "users", Type: Map, Doc: "users, by name: who a uid or a paired token is"},
	{Path: "users.*.uid", Type: Integer, Min: f(0), Max: f(4294967295), Unique: true,
		Doc: "local uid bound to this user on the socket"},
	{Path: "users.*.permission_profiles", Type: Array, Items: String, Default: []any{}, Ref: "permission_profiles",
		Doc: "the permission profiles this user holds"},
	{Path: "permission_profiles", Type: Map, Doc: "named sets of grants"},
	{Path: "permission_profiles.*.permissions", Type: Array, Items: String, Default: []any{}, Enum: Permissions,
		Doc: "permissions granted"},
	{Path: "permission_profiles.*.config_paths", Type: Array, Items: String, Default: []any{}, Pattern: configPathPattern,
		Doc: "config paths Config:Read and Config:Update apply to: a path covers itself and everything below; * matches one segment"},
	{Path: "permission_profiles.*.agents", Type: Array, Items: String, Default: []any{}, Ref: "agents", Wildcard: true,
		Doc: "agent aliases the holder may use; * for all"},

	// Agents; "default" exists out of the box.
	{Path: "agents", Type: Map, Default: []string{"default"}, Doc: "agents, by alias"},
	{Path: "agents.*.provider", Type: String, Default: "scripted", Enum: Providers,
		Doc: "model provider: scripted (offline, reads the prompt as commands) or openai (any OpenAI-compatible endpoint)"},
	{Path: "agents.*.model", Type: String, Default: "", Doc: "model name at the provider"},
	{Path: "agents.*.base_url", Type: String, Default: "", Pattern: urlPattern, Doc: "provider endpoint; empty for the provider's own"},
	{Path: "agents.*.api_key", Type: String, Default: "", Secret: true, Doc: "provider credential"},
	{Path: "agents.*.system_prompt", Type: String, Default: "", Doc: "system prompt"},
	{Path: "agents.*.tools", Type: Array, Items: String, Default: []any{}, Pattern: toolPattern, MaxLen: 128,
		Doc: "tools the agent may call; empty means every tool (built-in and plugin)"},
	{Path: "agents.*.approval_required", Type: Array, Items: String, Default: []any{}, Pattern: toolPattern, MaxLen: 128,
		Doc: "tools whose calls need an approval"},
	{Path: "agents.*.approval_timeout_secs", Type: Integer, Default: 120, Min: f(1), Max: f(86400),
		Doc: "an approval nobody answers within this is denied"},
	{Path: "agents.*.timeout_secs", Type: Integer, Default: 60, Min: f(1), Max: f(3600),
		Doc: "longest wait for the provider's response and for each streamed chunk"},
	{Path: "agents.*.step_timeout_secs", Type: Integer, Default: 1800, Min: f(1), Max: f(86400),
		Doc: "longest one provider step may take, from its request to its last byte, keep-alives included; past it the turn fails"},
	{Path: "agents.*.context_budget_tokens", Type: Integer, Default: 100000, Min: f(1), Max: f(100_000_000),
		Doc: "tokens of retained context the agent's model is given; past it the oldest turns are trimmed (estimate: a token per 4 bytes, plus 4 per message)"},

	// Plugins (seed 003).
	{Path: "plugins.enabled", Type: Bool, Default: true, Doc: "load plugins; false unloads every plugin at the next scan"},
	{Path: "plugins.plugins_dir", Type: String, Default: "", Restart: true, Doc: "plugin folder; empty for <data_dir>/plugins"},
	{Path: "plugins.scan_interval_ms", Type: Integer, Default: 2000, Min: f(100), Max: f(3_600_000), Restart: true,
		Doc: "how often each sandbox replica rescans the plugin folder for installs and removals"},
	{Path: "plugins.limits.call_fuel", Type: Integer, Restart: true, Default: 1_000_000_000, Min: f(1), Max: f(1 << 53), Doc: "instruction units per call"},
	{Path: "plugins.limits.call_timeout_ms", Type: Integer, Restart: true, Default: 30000, Min: f(1), Max: f(3_600_000), Doc: "wall clock per call"},
	{Path: "plugins.limits.max_memory_mb", Type: Integer, Restart: true, Default: 256, Min: f(1), Max: f(4096), Doc: "linear memory per instance"},
	{Path: "plugins.limits.max_table_elements", Type: Integer, Restart: true, Default: 100_000, Min: f(1), Max: f(10_000_000), Doc: "elements per table"},
	{Path: "plugins.limits.max_instances", Type: Integer, Restart: true, Default: 64, Min: f(1), Max: f(4096), Doc: "instances host-wide"},
	{Path: "plugins.limits.max_total_memory_mb", Type: Integer, Restart: true, Default: 1024, Min: f(1), Max: f(1 << 20),
		Doc: "linear memory of every instance together, in each sandbox replica; past it an instance is not made and a memory does not grow (keep it under the replica's memory limit, less 128 MiB for the rest of the process)"},
	{Path: "plugins.http.allowed_networks", Type: Array, Items: String, Default: []any{}, Valid: checkCIDR, Restart: true,
		Doc: "networks (CIDR) a plugin's outbound HTTP may reach although they are not public: loopback, private, link-local (cloud metadata), shared and unspecified addresses are refused unless listed here"},
	{Path: "plugins.security.signature_mode", Type: String, Default: "permissive", Enum: []string{"disabled", "permissive", "strict"},
		Doc: "manifest signatures: disabled ignores them; permissive verifies them and loads every plugin, warning about a missing, untrusted or failing one; strict loads only plugins signed by a trusted key"},
	{Path: "plugins.security.trusted_publisher_keys", Type: Array, Items: String, Default: []any{}, Pattern: hexKey,
		Doc: "Ed25519 publisher keys, hexadecimal"},
	{Path: "plugins.entries", Type: Map, Doc: "plugin instances, by key"},
	{Path: "plugins.entries.*.config", Type: Object, Items: String, Default: map[string]any{}, Secret: true,
		Doc: "the operator's values for the plugin, validated against its manifest's config_schema"},
	{Path: "channels.plugin", Type: Map, Doc: "channel plugins, by alias: each binds a channel plugin to a host listener and an agent"},
	{Path: "channels.plugin.*.plugin", Type: String, Default: "", Pattern: pluginName, MaxLen: 64, Doc: "the channel plugin's name"},
	{Path: "channels.plugin.*.listen", Type: String, Default: "127.0.0.1:0", Pattern: listenAddr,
		Doc: "host:port of the host listener that feeds the channel; the host is explicit (0.0.0.0 for every interface)"},
	{Path: "channels.plugin.*.agent", Type: String, Default: "default", Ref: "agents", Doc: "agent that answers the channel's messages"},
	{Path: "channels.plugin.*.max_sessions", Type: Integer, Default: 256, Min: f(8), Max: f(512),
		Doc: "conversations of the channel kept open in the session service, all sandbox replicas together; past it the least recently active idle one is closed (its history kept: its next message reopens it), so that the channel's senders never take the operator's own open sessions (1000 a principal)"},
	{Path: "channels.plugin.*.spool_max_mb", Type: Integer, Default: 64, Min: f(1), Max: f(1 << 20),
		Doc: "MiB of the channel's accepted and not yet delivered messages kept on disk (its spool), all sandbox replicas together, each message counted in whole 4 KiB blocks; past it a new message is refused (503, Retry-After) before it is taken, until delivery brings the spool below it"},
	{Path: "channels.plugin.*.max_content_kb", Type: Integer, Default: 1024, Min: f(1), Max: f(8192),
		Doc: "KiB of content one message the channel's plugin polls may carry (at most 8 MiB, what the gateway takes as one prompt by default); a larger one is not delivered and its sender is told its size and this bound. The listener takes 1 MiB a message; a plugin that fetches its messages itself may bring larger ones"},
	{Path: "channels.plugin.*.refused_answers", Type: Integer, Default: 3, Min: f(1), Max: f(60),
		Doc: "times the channel's plugin may answer again, without reading its queue, a polled message refused for its size before the host rebuilds the plugin's polling instance, and, rebuilt, before the binding fails (its plugin's own service holds the message); each answer waits about a poll interval (1 s)"},
	{Path: "channels.plugin.*.token", Type: String, Default: "", Secret: true, Pattern: durableToken,
		Doc: "bearer token the host listener requires of every message (at least 32 printable ASCII bytes); without one the listener refuses everything, since any local account can reach a loopback port"},

	// Uploads (docs/spec.md §6).
	{Path: "uploads.chunk_bytes", Type: Integer, Default: 1048576, Min: f(1024), Max: f(4 << 20), Doc: "largest decoded chunk"},
	{Path: "uploads.max_file_bytes", Type: Integer, Default: 10485760, Min: f(1), Max: f(1 << 30), Doc: "largest file"},
	{Path: "uploads.max_per_connection", Type: Integer, Default: 4, Min: f(1), Max: f(1024), Doc: "staged uploads per connection"},
	{Path: "uploads.max_staged_bytes", Type: Integer, Default: 268435456, Min: f(1 << 20), Max: f(1 << 36), Doc: "staged bytes across the daemon"},
	{Path: "uploads.max_user_staged_bytes", Type: Integer, Default: 134217728, Min: f(1 << 20), Max: f(1 << 36),
		Doc: "staged bytes of one user's uploads, across its connections (any principal but the operator), so that one user cannot take the whole staging budget"},
	{Path: "uploads.idle_timeout_secs", Type: Integer, Default: 300, Min: f(1), Max: f(86400), Doc: "an idle staged upload is reclaimed after this"},
	{Path: "uploads.max_user_stored_bytes", Type: Integer, Default: 1 << 30, Min: f(0), Max: f(1 << 50),
		Doc: "bytes of stored files the sessions of one user (any principal but the operator) may hold; a session's files are freed when it is deleted"},
	{Path: "uploads.max_user_stored_files", Type: Integer, Default: 100000, Min: f(0), Max: f(1 << 30),
		Doc: "stored files the sessions of one user (any principal but the operator) may hold"},

	// The durable bridge (seed 004).
	{Path: "durable.socket_path", Type: String, Default: "", Restart: true, Doc: "private socket; empty for COLLIE_DURABLE_SOCKET or <data>/durable.sock"},
	{Path: "durable.listen_url", Type: String, Default: "", Pattern: urlPattern, Restart: true, Doc: "TLS URL to serve on; empty for the socket only"},
	{Path: "durable.token", Type: String, Default: "", Secret: true, Pattern: durableToken,
		Doc: "bearer token for the TLS transport: at least 32 printable ASCII bytes"},
	{Path: "durable.tls_cert_file", Type: String, Default: "", Restart: true, Doc: "TLS certificate (PEM)"},
	{Path: "durable.tls_key_file", Type: String, Default: "", Restart: true, Doc: "TLS private key (PEM)"},
	{Path: "durable.refuse_descendants", Type: Bool, Default: false, Doc: "answer 403 caller-refused to the agent's own descendants"},
	{Path: "durable.starters", Type: Map,
		Doc: "starters the phone offers on its New page, by id (the phone shows at most 50, in id order): each opens a new session"},
	{Path: "durable.starters.*.title", Type: String, Default: "", Pattern: noControl, MaxLen: 64, Doc: "the starter's title; empty shows its id"},
	{Path: "durable.starters.*.description", Type: String, Default: "", Pattern: noControl, MaxLen: 256, Doc: "one line under the title"},
	{Path: "durable.starters.*.agent", Type: String, Default: "default", Ref: "agents", Doc: "agent alias of the session it opens"},
	{Path: "durable.starters.*.prompt", Type: String, Default: "",
		Doc: "first prompt of the session; the phone's text, when it sends one, follows it; empty with no text starts no turn"},
}

// checkCIDR accepts a network as netip.ParsePrefix reads it
// ("10.0.0.0/8", "fd00::/8"): the sandbox takes it as it is.
func checkCIDR(s string) error {
	if _, err := netip.ParsePrefix(s); err != nil {
		return errors.New("not a network in CIDR form (such as 10.0.0.0/8 or fd00::/8)")
	}
	return nil
}

// patternForms says in words what each pattern accepts, for the refusal
// of a value that does not match (a secret's refusal cannot show the
// value, so the form is all it can say).
var patternForms = map[*regexp.Regexp]string{
	configPathPattern: "a dotted config path whose segments are letters, digits, _ : @ - (not first) or *",
	urlPattern:        "empty, or a URL starting http://, https:// or unix:// without spaces",
	toolPattern:       "a tool name: letters, digits, _ . : - (not first)",
	hexKey:            "64 lower-case hexadecimal characters",
	durableToken:      "empty, or at least 32 printable ASCII characters without spaces",
	pluginName:        "a plugin name: lower-case letters, digits, _ - (not first)",
	listenAddr:        "host:port with an explicit host (an IPv4 address, [IPv6] or localhost), such as 127.0.0.1:0 or 0.0.0.0:8080",
	noControl:         "one line of text, without control characters",
}
