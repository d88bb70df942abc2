package pluginsandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Settings are what a replica reads from the config document at start.
// Changing them needs a restart.
type Settings struct {
	// Limits are plugins.limits.*; absent fields take seed 003's defaults.
	Limits wasmhost.Limits
	// PluginsDir is plugins.plugins_dir; empty means <data_dir>/plugins.
	PluginsDir string
}

// liveTimeout bounds reading the config document at start; the launcher
// starts the config service first, so this only matters when it is down.
const liveTimeout = 15 * time.Second

// ErrSettings: a plugins.* value in the config document is unusable.
var ErrSettings = errors.New("pluginsandbox: invalid plugins settings")

// ReadSettings reads plugins.limits.* and plugins.plugins_dir through the
// config service's Live RPC. A config service that does not implement Live
// yet (Unimplemented) means the defaults; any other failure is returned, so
// a replica never runs with limits the operator did not choose.
func ReadSettings(ctx context.Context, client configv1.ConfigServiceClient, dataDir string) (Settings, error) {
	s := Settings{Limits: wasmhost.DefaultLimits()}
	ctx, cancel := context.WithTimeout(ctx, liveTimeout)
	defer cancel()
	resp, err := client.Live(ctx, &configv1.LiveRequest{}, grpc.WaitForReady(true))
	switch {
	case status.Code(err) == codes.Unimplemented:
	case err != nil:
		return s, fmt.Errorf("pluginsandbox: read the config document: %w", err)
	default:
		if s, err = settingsFrom(resp.GetDocument().AsMap(), s); err != nil {
			return s, err
		}
	}
	if s.PluginsDir == "" {
		s.PluginsDir = filepath.Join(dataDir, "plugins")
	}
	return s, s.Limits.Validate()
}

// settingsFrom overlays the document's plugins section on s.
func settingsFrom(doc map[string]any, s Settings) (Settings, error) {
	plugins, _ := doc["plugins"].(map[string]any)
	if dir, ok := plugins["plugins_dir"].(string); ok {
		s.PluginsDir = dir
	}
	limits, _ := plugins["limits"].(map[string]any)
	for _, f := range []struct {
		name string
		dst  *uint64
	}{
		{"call_fuel", &s.Limits.CallFuel},
		{"call_timeout_ms", &s.Limits.CallTimeoutMS},
		{"max_memory_mb", &s.Limits.MaxMemoryMB},
		{"max_table_elements", &s.Limits.MaxTableElements},
		{"max_instances", &s.Limits.MaxInstances},
	} {
		raw, ok := limits[f.name]
		if !ok || raw == nil {
			continue
		}
		n, ok := raw.(float64)
		if !ok || n < 1 || n != math.Trunc(n) || n > 1<<62 {
			return s, fmt.Errorf("%w: plugins.limits.%s = %v, want a positive integer", ErrSettings, f.name, raw)
		}
		*f.dst = uint64(n)
	}
	return s, nil
}

// Register builds a replica inside the service frame: it reads its
// settings from the config service, starts a wasmhost.Host (compile cache
// <data_dir>/wasm-cache, shared by replicas), loads the plugins and
// registers PluginService. The host and the plugins close with the process.
func Register(ctx context.Context, env *service.Env) error {
	conn, err := grpcclient.Dial(env.Peers.Config)
	if err != nil {
		return fmt.Errorf("config service: %w", err)
	}
	env.OnClose(func() { _ = conn.Close() })
	client := configv1.NewConfigServiceClient(conn)
	settings, err := ReadSettings(ctx, client, env.DataDir)
	if err != nil {
		return err
	}
	host, err := wasmhost.New(ctx, wasmhost.Config{
		Limits:   settings.Limits,
		CacheDir: filepath.Join(env.DataDir, "wasm-cache"),
		Logger:   env.Log,
	})
	if err != nil {
		return err
	}
	env.OnClose(func() { _ = host.Close(context.Background()) })
	srv, err := NewServer(ctx, Config{
		Host: host, PluginsDir: settings.PluginsDir, Logger: env.Log,
		ConfigSource: &ConfigService{Client: client, Log: env.Log},
	})
	if err != nil {
		return err
	}
	env.OnClose(func() { _ = srv.Close(context.Background()) })
	l := settings.Limits
	env.Log.Info("plugin sandbox ready",
		zap.String("plugins_dir", settings.PluginsDir), zap.Strings("tools", srv.toolNames()),
		zap.Uint64("call_fuel", l.CallFuel), zap.Uint64("call_timeout_ms", l.CallTimeoutMS),
		zap.Uint64("max_memory_mb", l.MaxMemoryMB), zap.Uint64("max_table_elements", l.MaxTableElements),
		zap.Uint64("max_instances", l.MaxInstances))
	pluginv1.RegisterPluginServiceServer(env.Server.GRPC, srv)
	return nil
}

func (s *Server) toolNames() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.tools))
	for n := range s.tools {
		names = append(names, n)
	}
	return names
}
