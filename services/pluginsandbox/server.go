// Package pluginsandbox is the plugin-sandbox service: it discovers plugins
// under the plugins directory, loads their tools into a wasmhost.Host and
// serves clawmesh.plugin.v1.PluginService. Replicas keep no shared state:
// each loads the same plugins from the same directory, so any replica can
// serve any call.
package pluginsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Config configures a Server.
type Config struct {
	// Host runs the plugins; the Server does not close it.
	Host *wasmhost.Host
	// PluginsDir holds one directory per plugin, each with manifest.toml.
	PluginsDir string
	// ConfigSource resolves plugin config and secrets (the config service).
	ConfigSource wasmhost.ConfigSource
	// Grant decides the effective grants of an admitted manifest; nil grants
	// what the manifest requests.
	Grant func(*manifest.Manifest) wasmhost.Grants
	// Settings returns the live settings (plugins.enabled,
	// plugins.security, channels.plugin) at each scan; nil means
	// DefaultLive.
	Settings func() Live
	// Reveal reads a secret config value (a channel's listener token);
	// nil leaves every channel listener refusing, as without a token.
	Reveal func(ctx context.Context, prop string) (string, error)
	// Sessions is the session service channel messages are handed to; nil
	// leaves channel bindings without a consumer (messages are logged and
	// dropped).
	Sessions sessionv1.SessionServiceClient
	// MemoryDir keeps each memory plugin's entries on disk (a journal per
	// plugin), so they outlive the sandbox; empty keeps them in memory
	// only.
	MemoryDir string
	// ChannelSpoolDir keeps the channels' accepted messages on disk
	// until each is done with, so that a replica that dies holding some
	// leaves them to the next (channel_spool.go); empty keeps them in
	// memory only.
	ChannelSpoolDir string
	// Logger is required.
	Logger *zap.Logger
}

// Server implements pluginv1.PluginServiceServer.
type Server struct {
	pluginv1.UnimplementedPluginServiceServer
	cfg    Config
	logger *zap.Logger

	scanMu sync.Mutex // one scan at a time
	// movedAside is set by a scan that kept a plugin whose folder an
	// upgrade moved aside; asideScans counts such scans in a row. Both
	// are guarded by scanMu.
	movedAside bool
	asideScans int
	mu         sync.RWMutex
	cat        *catalog
	kick       chan struct{}

	channels *binder
	// spools are the channels' spools by alias and plugin
	// (channel_spool.go), kept across rebinds like the queues they mirror.
	spoolMu sync.Mutex
	spools  map[spoolKey]*channelSpool
	bg      sync.WaitGroup // unloads
}

// NewServer discovers and loads the plugins in cfg.PluginsDir (one scan;
// Run keeps rescanning). A plugin whose manifest, signature or module is
// refused is logged and skipped, never fatal.
func NewServer(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Host == nil || cfg.Logger == nil {
		return nil, errors.New("pluginsandbox: Host and Logger are required")
	}
	if cfg.Grant == nil {
		cfg.Grant = func(m *manifest.Manifest) wasmhost.Grants {
			return wasmhost.Grants{ConfigRead: m.Requests(manifest.PermConfigRead), HTTPClient: m.Requests(manifest.PermHTTPClient)}
		}
	}
	s := &Server{cfg: cfg, logger: cfg.Logger, cat: &catalog{live: DefaultLive(), refusals: map[*entry]string{}}, kick: make(chan struct{}, 1)}
	s.channels = newBinder(s)
	if err := s.Rescan(ctx); err != nil {
		s.logger.Warn("plugin scan", zap.Error(err))
	}
	return s, nil
}

func (s *Server) current() *catalog {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cat
}

// Close stops the channel bindings and unloads every plugin. The host
// stays open.
func (s *Server) Close(ctx context.Context) error {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	s.channels.close(ctx)
	s.closeSpools()
	s.mu.Lock()
	old := s.cat
	s.cat = &catalog{live: old.live, refusals: map[*entry]string{}}
	s.mu.Unlock()
	for _, e := range old.entries {
		e.unload(ctx)
	}
	s.bg.Wait()
	return nil
}

// ListPlugins lists the loaded plugins (with all, the refused and failed
// ones too) and whether the plugin system is enabled.
func (s *Server) ListPlugins(_ context.Context, req *pluginv1.ListPluginsRequest) (*pluginv1.ListPluginsResponse, error) {
	c := s.current()
	resp := &pluginv1.ListPluginsResponse{Enabled: c.live.Enabled, PluginsDir: s.cfg.PluginsDir, SignatureMode: string(c.live.Policy.Mode)}
	for _, e := range c.entries {
		p := describe(c, e)
		if p.Status != statusLoaded && !req.GetAll() {
			continue
		}
		resp.Plugins = append(resp.Plugins, p)
	}
	return resp, nil
}

// Plugin states in ListPlugins.
const (
	statusLoaded  = "loaded"
	statusRefused = "refused"
	statusFailed  = "failed"
)

func describe(c *catalog, e *entry) *pluginv1.Plugin {
	p := &pluginv1.Plugin{Dir: e.dir, Status: statusLoaded, SignatureStatus: string(e.verdict.Status)}
	switch {
	case e.bundle == nil || e.err != nil:
		p.Status, p.Reason = statusFailed, errText(e.err)
	case e.policy != nil:
		p.Status, p.Reason = statusRefused, e.policy.Error()
	case c.refusals[e] != "":
		p.Status, p.Reason = statusRefused, c.refusals[e]
	}
	// A folder's name, and an error naming a path, need not be UTF-8,
	// which a proto string must be: one such folder in the plugins folder
	// made the whole answer unsendable, and plugins/list failed for every
	// plugin.
	p.Dir, p.Reason = strings.ToValidUTF8(p.Dir, "\uFFFD"), strings.ToValidUTF8(p.Reason, "\uFFFD")
	if e.bundle == nil {
		return p
	}
	m := e.bundle.Manifest
	p.Key = wasmhost.InstanceKey(m.Name, wasmhost.WorldTool, "")
	p.Name, p.Version, p.Description = m.Name, m.Version, m.Description
	if e.verdict.Verified() {
		p.Signed, p.Publisher = true, e.verdict.Key
	}
	for _, cp := range m.Capabilities {
		p.Capabilities = append(p.Capabilities, string(cp))
	}
	for _, perm := range m.Permissions {
		p.Permissions = append(p.Permissions, string(perm))
	}
	for _, perm := range m.Inert() {
		p.InertPermissions = append(p.InertPermissions, string(perm))
	}
	if e.tool != nil {
		p.ToolName = e.tool.Name()
	}
	for _, sk := range e.bundle.Skills {
		p.Skills = append(p.Skills, sk.ID)
	}
	return p
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// listBudget bounds a listing's answer below gRPC's 16 MiB message cap:
// past it the rest is left out and logged, where before the whole listing
// failed and its caller saw nothing. A variable so that a test may lower
// it.
var listBudget = 12 << 20

// ListTools lists every tool with its parameters schema, by name, within
// listBudget.
func (s *Server) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	c := s.current()
	resp := &pluginv1.ListToolsResponse{}
	for name, e := range c.tools {
		resp.Tools = append(resp.Tools, &pluginv1.Tool{
			Name: name, Description: e.tool.Description(),
			ParametersSchemaJson: string(e.tool.ParametersSchema()),
			PluginKey:            wasmhost.InstanceKey(e.name(), wasmhost.WorldTool, ""),
		})
	}
	sort.Slice(resp.Tools, func(i, j int) bool { return resp.Tools[i].Name < resp.Tools[j].Name })
	size := 0
	for i, t := range resp.Tools {
		if size += proto.Size(t) + 8; size > listBudget {
			s.logger.Warn("tools left out of the listing: it would pass its bound", zap.Int("listed", i), zap.Int("left_out", len(resp.Tools)-i))
			resp.Tools = resp.Tools[:i]
			break
		}
	}
	for name := range c.memories {
		resp.MemoryPlugins = append(resp.MemoryPlugins, name)
	}
	sort.Strings(resp.MemoryPlugins)
	resp.SkillCount = int32(len(c.skillIDs))
	return resp, nil
}

// acquireTool returns the plugin offering tool, holding a call reference
// on it, or nil. A plugin being unloaded was replaced in the catalog
// before: the tool is looked up again there, so a call racing an upgrade
// runs on the new load.
func (s *Server) acquireTool(tool string) *entry {
	for range maxLoadAttempts {
		p, ok := s.current().tools[tool]
		if toolLookupHook != nil {
			toolLookupHook(tool)
		}
		if !ok {
			return nil
		}
		if p.acquire() {
			return p
		}
	}
	return nil
}

// toolLookupHook, when set, runs in ExecuteTool between the tool's
// lookup and the call reference taken on its plugin: tests upgrade the
// plugin there.
var toolLookupHook func(tool string)

// ExecuteTool runs one tool call in a fresh instance. A guest stopped by a
// limit (fuel, deadline, memory), a trap or a malformed result is a failed
// tool call (success false, error says which limit); refusals before any
// guest code runs are gRPC errors.
func (s *Server) ExecuteTool(ctx context.Context, req *pluginv1.ExecuteToolRequest) (*pluginv1.ExecuteToolResponse, error) {
	p := s.acquireTool(req.GetToolName())
	if p == nil {
		return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, fmt.Sprintf("Unknown tool `%s`", req.GetToolName()))
	}
	defer p.release()
	argsJSON := req.GetArgumentsJson()
	if argsJSON == "" {
		argsJSON = "{}"
	}
	if !json.Valid([]byte(argsJSON)) {
		return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, "`arguments_json` is not valid JSON")
	}
	start := time.Now()
	res, err := p.tool.Execute(withPrincipal(ctx, req.GetPrincipal()), wasmhost.ToolCall{
		CallID: req.GetToolCallId(), Principal: req.GetPrincipal().GetPrincipalId(),
		Args: json.RawMessage(argsJSON), OutputLimit: max(int(req.GetOutputLimit()), 0),
	})
	took := time.Since(start)
	log := s.cfg.Logger.With(zap.String("tool", req.GetToolName()), zap.String("plugin", p.name()),
		zap.String("tool_call_id", req.GetToolCallId()), zap.Duration("took", took))
	s.observe(abi.ObserverToolCall, map[string]string{"tool": req.GetToolName(), "plugin": p.name(),
		"success": strconv.FormatBool(err == nil && res.Success), "took_ms": strconv.FormatInt(took.Milliseconds(), 10)})
	if err != nil {
		log.Info("tool call stopped", zap.Error(err))
		return toolFailure(err)
	}
	log.Info("tool executed", zap.Bool("success", res.Success), zap.Uint64("fuel_used", res.FuelUsed))
	// Only what the caller shows is sent, with the whole's size: an output
	// of up to the host's 16 MiB result crossed the socket whole to be cut
	// at once to the 1 MiB a client sees. The host cut it as it read it.
	out := &pluginv1.ExecuteToolResponse{Success: res.Success, Output: res.Output, OutputBytes: int64(res.OutputBytes), FuelUsed: int64(res.FuelUsed)}
	switch {
	case !res.Success && res.Error != nil && res.ErrorBytes > 0:
		// An error past the room shown, cut as it was read, is sent as
		// the failed call's output with its whole size: the response has
		// no size for its error, and the session shows a failed call's
		// output as it shows its error ("Tool x failed: ..."), cut with
		// the mark that names the whole's size. The output, which the
		// session does not show beside an error, is left out.
		out.Output, out.OutputBytes = *res.Error, int64(res.ErrorBytes)
	case res.Error != nil:
		out.Error = *res.Error
	}
	return out, nil
}

// toolFailure maps a wasmhost error to a response or a status.
func toolFailure(err error) (*pluginv1.ExecuteToolResponse, error) {
	switch {
	case errors.Is(err, wasmhost.ErrFuelExhausted), errors.Is(err, wasmhost.ErrCallTimeout),
		errors.Is(err, wasmhost.ErrMemoryLimit), errors.Is(err, wasmhost.ErrTrap),
		errors.Is(err, wasmhost.ErrABI):
		return &pluginv1.ExecuteToolResponse{Success: false, Error: err.Error()}, nil
	case errors.Is(err, wasmhost.ErrInstanceLimit):
		return nil, rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonCapacity, rpcerr.NoIndex, "the plugin sandbox is running its maximum number of instances; retry later")
	case errors.Is(err, wasmhost.ErrMemoryBudget):
		return nil, rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonCapacity, rpcerr.NoIndex, "the plugin sandbox's instances hold all the memory it may give them; retry later: "+err.Error())
	case errors.Is(err, wasmhost.ErrConfigUnavailable):
		return nil, rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, "plugin config unavailable")
	case errors.Is(err, wasmhost.ErrConfig):
		return nil, rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonInvalid, rpcerr.NoIndex, "plugin config rejected: "+err.Error())
	case errors.Is(err, wasmhost.ErrCancelled):
		return nil, rpcerr.Error(codes.Canceled, rpcerr.ReasonInvalid, rpcerr.NoIndex, "tool call cancelled")
	case errors.Is(err, wasmhost.ErrClosed), errors.Is(err, wasmhost.ErrUnavailable):
		return nil, rpcerr.Error(codes.Unavailable, rpcerr.ReasonCapacity, rpcerr.NoIndex, "plugin sandbox unavailable")
	default:
		return nil, rpcerr.Error(codes.Internal, rpcerr.ReasonInvalid, rpcerr.NoIndex, "plugin sandbox: tool execution failed")
	}
}
