package configclient

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/configschema"
)

// The typed views of the live document. Every field falls back to the
// schema's default (internal/configschema), the one place defaults are
// written; the config service's document already holds them, so the
// fallback only matters for a document that lacks a property.

// RPCLimits are the edge's settings (rpc.*), read by the gateway when its
// listener starts.
type RPCLimits struct {
	MaxFrameBytes           int
	InitializeTimeout       time.Duration
	FrameTimeout            time.Duration
	WriteStallTimeout       time.Duration
	MaxConnections          int
	MaxInflightRequests     int
	MaxBufferedFrameBytes   int64
	MaxBufferedOutputBytes  int64
	AdvertisedServerVersion string
	// CallTimeout is the deadline of the gateway's short calls.
	CallTimeout time.Duration
}

// RPCLimits reads rpc.*.
func (s Snapshot) RPCLimits() RPCLimits {
	return RPCLimits{
		MaxFrameBytes:           int(s.Int("rpc.max_frame_bytes")),
		InitializeTimeout:       s.Millis("rpc.initialize_timeout_ms"),
		FrameTimeout:            s.Millis("rpc.frame_timeout_ms"),
		WriteStallTimeout:       s.Millis("rpc.write_stall_timeout_ms"),
		MaxConnections:          int(s.Int("rpc.max_local_connections")),
		MaxInflightRequests:     int(s.Int("rpc.max_inflight_requests")),
		MaxBufferedFrameBytes:   s.Int("rpc.max_buffered_frame_bytes"),
		MaxBufferedOutputBytes:  s.Int("rpc.max_buffered_output_bytes"),
		AdvertisedServerVersion: s.String("rpc.advertised_server_version"),
		CallTimeout:             s.Millis("rpc.call_timeout_ms"),
	}
}

// PluginSettings are plugins.* (the sandbox reads the limits at start).
type PluginSettings struct {
	// PluginsDir is plugins.plugins_dir; empty means <data_dir>/plugins.
	PluginsDir       string
	CallFuel         uint64
	CallTimeout      time.Duration
	MaxMemoryMB      uint64
	MaxTableElements uint64
	MaxInstances     uint64
	MaxTotalMemoryMB uint64
	// HTTPAllowedNetworks is plugins.http.allowed_networks: CIDRs a
	// plugin's outbound HTTP may reach though they are not public.
	HTTPAllowedNetworks []string
	// SignatureMode is disabled, permissive or strict.
	SignatureMode        string
	TrustedPublisherKeys []string
}

// PluginSettings reads plugins.*.
func (s Snapshot) PluginSettings() PluginSettings {
	return PluginSettings{
		PluginsDir:           s.String("plugins.plugins_dir"),
		CallFuel:             s.Uint("plugins.limits.call_fuel"),
		CallTimeout:          s.Millis("plugins.limits.call_timeout_ms"),
		MaxMemoryMB:          s.Uint("plugins.limits.max_memory_mb"),
		MaxTableElements:     s.Uint("plugins.limits.max_table_elements"),
		MaxInstances:         s.Uint("plugins.limits.max_instances"),
		MaxTotalMemoryMB:     s.Uint("plugins.limits.max_total_memory_mb"),
		HTTPAllowedNetworks:  s.Strings("plugins.http.allowed_networks"),
		SignatureMode:        s.String("plugins.security.signature_mode"),
		TrustedPublisherKeys: s.Strings("plugins.security.trusted_publisher_keys"),
	}
}

// Agent is one agents.<alias> entry. Secrets (api_key) are masked here:
// read them with the Reveal RPC.
type Agent struct {
	Alias            string
	Provider         string
	Model            string
	BaseURL          string
	SystemPrompt     string
	Tools            []string
	ApprovalRequired []string
	ApprovalTimeout  time.Duration
	Timeout          time.Duration
	// StepTimeout bounds one provider step whole: Timeout bounds only the
	// gaps, which a provider's keep-alives fill for ever.
	StepTimeout time.Duration
	// ContextBudgetTokens bounds the retained context (estimated tokens).
	ContextBudgetTokens int64
}

// AgentDefaults is an agent with every field at the schema's default.
func AgentDefaults() Agent {
	a, _ := Snapshot{Document: map[string]any{"agents": map[string]any{"default": map[string]any{}}}}.Agent("default")
	return a
}

// Agent reads agents.<alias>; ok is false when the alias is not
// configured.
func (s Snapshot) Agent(alias string) (a Agent, ok bool) {
	base := "agents." + alias
	if v, found := s.Value(base); !found || !isObject(v) {
		return Agent{}, false
	}
	return Agent{
		Alias:               alias,
		Provider:            s.String(base + ".provider"),
		Model:               s.String(base + ".model"),
		BaseURL:             s.String(base + ".base_url"),
		SystemPrompt:        s.String(base + ".system_prompt"),
		Tools:               s.Strings(base + ".tools"),
		ApprovalRequired:    s.Strings(base + ".approval_required"),
		ApprovalTimeout:     time.Duration(s.Int(base+".approval_timeout_secs")) * time.Second,
		Timeout:             time.Duration(s.Int(base+".timeout_secs")) * time.Second,
		StepTimeout:         time.Duration(s.Int(base+".step_timeout_secs")) * time.Second,
		ContextBudgetTokens: s.Int(base + ".context_budget_tokens"),
	}, true
}

// Uploads are uploads.* (docs/spec.md §6).
type Uploads struct {
	ChunkBytes       int64
	MaxFileBytes     int64
	MaxPerConnection int
	MaxStagedBytes   int64
	// MaxUserStagedBytes bounds what one principal (not the operator)
	// stages across its connections.
	MaxUserStagedBytes int64
	IdleTimeout        time.Duration
	// MaxUserStoredBytes and MaxUserStoredFiles bound what the sessions of
	// one user (any owner but the operator) hold in stored files.
	MaxUserStoredBytes int64
	MaxUserStoredFiles int64
}

// Uploads reads uploads.*.
func (s Snapshot) Uploads() Uploads {
	return Uploads{
		ChunkBytes:         s.Int("uploads.chunk_bytes"),
		MaxFileBytes:       s.Int("uploads.max_file_bytes"),
		MaxPerConnection:   int(s.Int("uploads.max_per_connection")),
		MaxStagedBytes:     s.Int("uploads.max_staged_bytes"),
		MaxUserStagedBytes: s.Int("uploads.max_user_staged_bytes"),
		IdleTimeout:        time.Duration(s.Int("uploads.idle_timeout_secs")) * time.Second,
		MaxUserStoredBytes: s.Int("uploads.max_user_stored_bytes"),
		MaxUserStoredFiles: s.Int("uploads.max_user_stored_files"),
	}
}

// Durable is durable.*, the durable bridge's settings (its token is a
// secret: masked here).
type Durable struct {
	SocketPath        string
	ListenURL         string
	TLSCertFile       string
	TLSKeyFile        string
	RefuseDescendants bool
	// Starters are durable.starters.<id>, in id order.
	Starters []DurableStarter
}

// DurableStarter is one durable.starters.<id> entry.
type DurableStarter struct {
	ID          string
	Title       string
	Description string
	// Agent is the agent alias of the session the starter opens.
	Agent  string
	Prompt string
}

// Durable reads durable.*.
func (s Snapshot) Durable() Durable {
	d := Durable{
		SocketPath:        s.String("durable.socket_path"),
		ListenURL:         s.String("durable.listen_url"),
		TLSCertFile:       s.String("durable.tls_cert_file"),
		TLSKeyFile:        s.String("durable.tls_key_file"),
		RefuseDescendants: s.Bool("durable.refuse_descendants"),
	}
	entries, _ := s.Value("durable.starters")
	byID, _ := entries.(map[string]any)
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		if !isObject(byID[id]) {
			continue
		}
		base := "durable.starters." + id
		d.Starters = append(d.Starters, DurableStarter{
			ID:          id,
			Title:       s.String(base + ".title"),
			Description: s.String(base + ".description"),
			Agent:       s.String(base + ".agent"),
			Prompt:      s.String(base + ".prompt"),
		})
	}
	return d
}

// RPCLimits, PluginSettings, Agent, Uploads and Durable of the current
// revision.
func (c *Client) RPCLimits() RPCLimits           { return c.Current().RPCLimits() }
func (c *Client) PluginSettings() PluginSettings { return c.Current().PluginSettings() }
func (c *Client) Agent(alias string) (Agent, bool) {
	return c.Current().Agent(alias)
}
func (c *Client) Uploads() Uploads { return c.Current().Uploads() }
func (c *Client) Durable() Durable { return c.Current().Durable() }

// Int reads an integer property, else its schema default (0 when none).
// Integers travel as JSON numbers; the schema bounds every integer
// property below 2^53, so the conversion is exact.
func (s Snapshot) Int(path string) int64 {
	if v, ok := s.Value(path); ok {
		if n, ok := v.(float64); ok && n == math.Trunc(n) {
			return int64(n)
		}
	}
	if n, ok := schemaDefault(path).(int); ok {
		return int64(n)
	}
	return 0
}

// Uint reads a count; a negative value reads as 0, which every consumer
// refuses as a limit.
func (s Snapshot) Uint(path string) uint64 {
	return uint64(max(s.Int(path), 0))
}

// Millis reads an integer property counted in milliseconds.
func (s Snapshot) Millis(path string) time.Duration {
	return time.Duration(s.Int(path)) * time.Millisecond
}

// String reads a string property, else its schema default.
func (s Snapshot) String(path string) string {
	if v, ok := s.Value(path); ok {
		if str, ok := v.(string); ok {
			return str
		}
	}
	str, _ := schemaDefault(path).(string)
	return str
}

// Bool reads a boolean property, else its schema default.
func (s Snapshot) Bool(path string) bool {
	if v, ok := s.Value(path); ok {
		if b, ok := v.(bool); ok {
			return b
		}
	}
	b, _ := schemaDefault(path).(bool)
	return b
}

// Strings reads a list of strings, else its schema default.
func (s Snapshot) Strings(path string) []string {
	v, ok := s.Value(path)
	if !ok {
		v = schemaDefault(path)
	}
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		if str, ok := x.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

func schemaDefault(path string) any {
	p, err := configschema.Lookup(path)
	if err != nil {
		return nil
	}
	return p.Default
}

func isObject(v any) bool { _, ok := v.(map[string]any); return ok }
