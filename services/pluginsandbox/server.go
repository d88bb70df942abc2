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
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/manifest"
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
	// Logger is required.
	Logger *zap.Logger
}

type loadedPlugin struct {
	m    *manifest.Manifest
	key  string
	tool *wasmhost.Tool // nil unless the plugin has the tool capability
}

// Server implements pluginv1.PluginServiceServer.
type Server struct {
	pluginv1.UnimplementedPluginServiceServer
	cfg     Config
	mu      sync.RWMutex
	plugins []*loadedPlugin
	tools   map[string]*loadedPlugin
}

// NewServer discovers and loads the plugins in cfg.PluginsDir. A plugin
// whose manifest or module is refused is logged and skipped, never fatal.
func NewServer(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Host == nil || cfg.Logger == nil {
		return nil, errors.New("pluginsandbox: Host and Logger are required")
	}
	if cfg.Grant == nil {
		cfg.Grant = func(m *manifest.Manifest) wasmhost.Grants {
			return wasmhost.Grants{ConfigRead: m.Requests(manifest.PermConfigRead), HTTPClient: m.Requests(manifest.PermHTTPClient)}
		}
	}
	s := &Server{cfg: cfg, tools: map[string]*loadedPlugin{}}
	if cfg.PluginsDir == "" {
		return s, nil
	}
	entries, err := os.ReadDir(cfg.PluginsDir)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pluginsandbox: read plugins dir: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(cfg.PluginsDir, e.Name())
		if err := s.load(ctx, dir); err != nil {
			cfg.Logger.Warn("plugin skipped", zap.String("dir", dir), zap.Error(err))
		}
	}
	return s, nil
}

func (s *Server) load(ctx context.Context, dir string) error {
	m, err := manifest.Load(dir)
	if err != nil {
		return err
	}
	p := &loadedPlugin{m: m, key: wasmhost.InstanceKey(m.Name, wasmhost.WorldTool, "")}
	if m.Has(manifest.CapTool) {
		wasm, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(m.WasmPath)))
		if err != nil {
			return fmt.Errorf("pluginsandbox: read module: %w", err)
		}
		p.tool, err = s.cfg.Host.LoadTool(ctx, wasmhost.PluginSpec{
			Name: m.Name, Version: m.Version, Wasm: wasm,
			Grants: s.cfg.Grant(m), Schema: m.Schema(), Config: s.cfg.ConfigSource,
		})
		if err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.tool != nil {
		if _, dup := s.tools[p.tool.Name()]; dup {
			_ = p.tool.Close(ctx)
			return fmt.Errorf("pluginsandbox: tool %q already provided by another plugin", p.tool.Name())
		}
		s.tools[p.tool.Name()] = p
	}
	s.plugins = append(s.plugins, p)
	s.cfg.Logger.Info("plugin loaded", zap.String("plugin", m.Name), zap.String("version", m.Version))
	return nil
}

// Close unloads every tool. The host stays open.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, p := range s.plugins {
		if p.tool != nil {
			errs = append(errs, p.tool.Close(ctx))
		}
	}
	s.plugins, s.tools = nil, map[string]*loadedPlugin{}
	return errors.Join(errs...)
}

// ListPlugins lists the loaded plugins.
func (s *Server) ListPlugins(context.Context, *pluginv1.ListPluginsRequest) (*pluginv1.ListPluginsResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	resp := &pluginv1.ListPluginsResponse{}
	for _, p := range s.plugins {
		pp := &pluginv1.Plugin{
			Key: p.key, Name: p.m.Name, Version: p.m.Version, Description: p.m.Description,
			Signed: p.m.Signature != "", Publisher: p.m.PublisherKey,
		}
		for _, c := range p.m.Capabilities {
			pp.Capabilities = append(pp.Capabilities, string(c))
		}
		for _, perm := range p.m.Permissions {
			pp.Permissions = append(pp.Permissions, string(perm))
		}
		resp.Plugins = append(resp.Plugins, pp)
	}
	return resp, nil
}

// ListTools lists every tool with its parameters schema.
func (s *Server) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	resp := &pluginv1.ListToolsResponse{}
	for name, p := range s.tools {
		resp.Tools = append(resp.Tools, &pluginv1.Tool{
			Name: name, Description: p.tool.Description(),
			ParametersSchemaJson: string(p.tool.ParametersSchema()), PluginKey: p.key,
		})
	}
	sort.Slice(resp.Tools, func(i, j int) bool { return resp.Tools[i].Name < resp.Tools[j].Name })
	return resp, nil
}

// ExecuteTool runs one tool call in a fresh instance. A guest stopped by a
// limit (fuel, deadline, memory), a trap or a malformed result is a failed
// tool call (success false, error says which limit); refusals before any
// guest code runs are gRPC errors.
func (s *Server) ExecuteTool(ctx context.Context, req *pluginv1.ExecuteToolRequest) (*pluginv1.ExecuteToolResponse, error) {
	s.mu.RLock()
	p, ok := s.tools[req.GetToolName()]
	s.mu.RUnlock()
	if !ok {
		return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, fmt.Sprintf("Unknown tool `%s`", req.GetToolName()))
	}
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
		Args: json.RawMessage(argsJSON),
	})
	log := s.cfg.Logger.With(zap.String("tool", req.GetToolName()), zap.String("plugin", p.m.Name),
		zap.String("tool_call_id", req.GetToolCallId()), zap.Duration("took", time.Since(start)))
	if err != nil {
		log.Info("tool call stopped", zap.Error(err))
		return toolFailure(err)
	}
	log.Info("tool executed", zap.Bool("success", res.Success), zap.Uint64("fuel_used", res.FuelUsed))
	out := &pluginv1.ExecuteToolResponse{Success: res.Success, Output: res.Output, FuelUsed: int64(res.FuelUsed)}
	if res.Error != nil {
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
