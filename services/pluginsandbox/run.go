package pluginsandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/service"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Settings are what a replica reads from the config document at start.
// Changing them needs a restart.
type Settings struct {
	// Limits are plugins.limits.*; absent fields take seed 003's defaults.
	Limits wasmhost.Limits
	// PluginsDir is plugins.plugins_dir; empty means <data_dir>/plugins.
	PluginsDir string
	// ScanInterval is plugins.scan_interval_ms: how often the replica
	// rescans the plugins folder.
	ScanInterval time.Duration
	// HTTPAllowedNetworks is plugins.http.allowed_networks: the networks
	// that are not public a plugin's outbound HTTP may still reach.
	HTTPAllowedNetworks []netip.Prefix
}

// ErrSettings: a plugins.* value in the config document is unusable.
var ErrSettings = errors.New("pluginsandbox: invalid plugins settings")

// SettingsFrom takes a replica's settings from the live config's
// plugins.* (configclient applies the schema's defaults); an empty
// plugins_dir means <data_dir>/plugins.
func SettingsFrom(p configclient.PluginSettings, dataDir string) (Settings, error) {
	s := Settings{Limits: wasmhost.LimitsFrom(p), PluginsDir: p.PluginsDir}
	if s.PluginsDir == "" {
		s.PluginsDir = filepath.Join(dataDir, "plugins")
	}
	if err := s.Limits.Validate(); err != nil {
		return s, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	for _, n := range p.HTTPAllowedNetworks {
		pfx, err := netip.ParsePrefix(n)
		if err != nil {
			return s, fmt.Errorf("%w: plugins.http.allowed_networks: %w", ErrSettings, err)
		}
		s.HTTPAllowedNetworks = append(s.HTTPAllowedNetworks, pfx)
	}
	return s, nil
}

// scanInterval reads plugins.scan_interval_ms (the schema bounds it).
func scanInterval(snap configclient.Snapshot) (time.Duration, error) {
	d := snap.Millis("plugins.scan_interval_ms")
	if d < 100*time.Millisecond {
		return 0, fmt.Errorf("%w: plugins.scan_interval_ms must be at least 100", ErrSettings)
	}
	return d, nil
}

// Register builds a replica inside the service frame: it reads its
// settings from the config service (waiting for it as long as it is
// away: service.Env.AwaitConfig), starts a wasmhost.Host (compile cache
// <data_dir>/wasm-cache, shared by replicas), loads the plugins and
// registers PluginService. It follows the live config (plugins.enabled,
// plugins.security.*, channels.plugin.*: a change triggers a rescan) and
// rescans the plugins folder every plugins.scan_interval_ms, so installs,
// removals and config changes apply on every replica without a restart or
// a signal. The host, the plugins and the channel bindings close with the
// process.
func Register(ctx context.Context, env *service.Env) error {
	conn, err := grpcclient.Dial(env.Peers.Config)
	if err != nil {
		return fmt.Errorf("config service: %w", err)
	}
	env.OnClose(func() { _ = conn.Close() })
	client := configv1.NewConfigServiceClient(conn)
	// The replica waits for config however long it is away
	// (AwaitConfig): which plugins load, their limits and the networks
	// they may reach are config's, never the defaults.
	live, err := env.AwaitConfig(ctx, client)
	if err != nil {
		return err
	}
	env.OnClose(live.Close)
	settings, err := SettingsFrom(live.PluginSettings(), env.DataDir)
	if err != nil {
		return err
	}
	if settings.ScanInterval, err = scanInterval(live.Current()); err != nil {
		return err
	}
	sessConn, err := grpcclient.Dial(env.Peers.Session)
	if err != nil {
		return fmt.Errorf("session service: %w", err)
	}
	env.OnClose(func() { _ = sessConn.Close() })
	// The first scan's compiles are most of the start (seconds each, and
	// each waits for a replica compiling the same module): health says
	// each, which the launcher's readiness bound takes for progress. The
	// scans after the start say nothing there.
	var registered atomic.Bool
	defer registered.Store(true)
	host, err := wasmhost.New(ctx, wasmhost.Config{
		Limits:   settings.Limits,
		CacheDir: filepath.Join(env.DataDir, "wasm-cache"),
		Logger:   env.Log,
		HTTP:     wasmhost.HTTPLimits{AllowedNetworks: settings.HTTPAllowedNetworks},
		Progress: func(what string) {
			if !registered.Load() {
				env.Starting(what)
			}
		},
	})
	if err != nil {
		return err
	}
	env.OnClose(func() { _ = host.Close(context.Background()) })
	lastLive, err := LiveFrom(live.Current())
	if err != nil {
		return err
	}
	// Called from Rescan only, which scans are serialised by.
	liveSettings := func() Live {
		l, err := LiveFrom(live.Current())
		if err != nil {
			// Keep the last good settings rather than load under a policy
			// the operator did not choose.
			env.Log.Warn("plugin settings unusable; keeping the previous ones", zap.Error(err))
			return lastLive
		}
		lastLive = l
		return l
	}
	srv, err := NewServer(ctx, Config{
		Host: host, PluginsDir: settings.PluginsDir, MemoryDir: datadir.Memories(env.DataDir), ChannelSpoolDir: datadir.ChannelSpool(env.DataDir), Logger: env.Log,
		ConfigSource: &ConfigService{Client: client, Log: env.Log},
		Settings:     liveSettings,
		Reveal: func(ctx context.Context, prop string) (string, error) {
			resp, err := client.Reveal(ctx, &configv1.RevealRequest{Prop: prop})
			if err != nil {
				return "", err
			}
			return resp.GetValue().GetStringValue(), nil
		},
		Sessions: sessionv1.NewSessionServiceClient(sessConn),
	})
	if err != nil {
		return err
	}
	live.OnChange(func(_ configclient.Snapshot, props []string) {
		if props == nil || slices.ContainsFunc(props, func(p string) bool {
			return strings.HasPrefix(p, "plugins.") || strings.HasPrefix(p, "channels.")
		}) {
			srv.Kick()
		}
	})
	runCtx, stopRun := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Run(runCtx, settings.ScanInterval)
	}()
	env.OnClose(func() {
		stopRun()
		<-done
		_ = srv.Close(context.Background())
	})
	l := settings.Limits
	env.Log.Info("plugin sandbox ready",
		zap.String("plugins_dir", settings.PluginsDir), zap.Strings("tools", srv.toolNames()),
		zap.Duration("scan_interval", settings.ScanInterval),
		zap.Uint64("call_fuel", l.CallFuel), zap.Uint64("call_timeout_ms", l.CallTimeoutMS),
		zap.Uint64("max_memory_mb", l.MaxMemoryMB), zap.Uint64("max_table_elements", l.MaxTableElements),
		zap.Uint64("max_instances", l.MaxInstances), zap.Uint64("max_total_memory_mb", l.MaxTotalMemoryMB),
		zap.Stringers("http_allowed_networks", settings.HTTPAllowedNetworks))
	pluginv1.RegisterPluginServiceServer(env.Server.GRPC, srv)
	return nil
}

func (s *Server) toolNames() []string {
	c := s.current()
	names := make([]string, 0, len(c.tools))
	for n := range c.tools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
