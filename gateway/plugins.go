package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// pluginsList is the socket's read-only view of plugins (seed 003's
// GET /api/plugins): every plugin a sandbox replica discovered, loaded or
// refused, the channel bindings it serves, and whether the plugin system
// is enabled. Params: {all?: bool} (default true). It needs
// plugins:manage.
//
// It goes through the gateway's one client of the sandbox's replicas
// (g.plugins), not a client made for the call: a new client knows
// nothing of the replicas, so on a hung sandbox (stopped: its socket
// accepts, nothing answers) each call paid a connect that timed out and
// the rest of the grace, 3 s, however often it had been told. The kept
// client remembers a replica found hung and does not pick it: with
// every replica hung the call fails at once, with another serving it
// goes there.
func (g *Gateway) pluginsList(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	p := struct {
		All *bool `json:"all"`
	}{}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	all := p.All == nil || *p.All
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	actx, acancel, cut := g.configWait(ctx)
	err := configclient.Authorize(actx, g.config, cs.principalOf(), configschema.PermPluginsManage, "")
	acancel()
	if err != nil {
		return nil, configError(err, cut(), false)
	}
	if g.plugins == nil {
		return nil, jsonrpc.NewError(jsonrpc.CodeInternal, "no plugin sandbox configured", nil)
	}
	list, err := grpcclient.ReadAgain(ctx, len(g.cfg.PluginAddrs), func() (*pluginv1.ListPluginsResponse, error) {
		return g.plugins.ListPlugins(ctx, &pluginv1.ListPluginsRequest{All: all})
	})
	if err != nil {
		return nil, serviceError("plugin-sandbox", err)
	}
	channels, err := grpcclient.ReadAgain(ctx, len(g.cfg.PluginAddrs), func() (*pluginv1.ListChannelsResponse, error) {
		return g.plugins.ListChannels(ctx, &pluginv1.ListChannelsRequest{})
	})
	if err != nil {
		return nil, serviceError("plugin-sandbox", err)
	}
	plugins := make([]map[string]any, 0, len(list.GetPlugins()))
	for _, pl := range list.GetPlugins() {
		plugins = append(plugins, map[string]any{
			"name": pl.GetName(), "version": pl.GetVersion(), "description": pl.GetDescription(),
			"dir": pl.GetDir(), "status": pl.GetStatus(), "reason": pl.GetReason(),
			"capabilities": orEmpty(pl.GetCapabilities()), "permissions": orEmpty(pl.GetPermissions()),
			"inert_permissions": orEmpty(pl.GetInertPermissions()),
			"signed":            pl.GetSigned(), "publisher_key": pl.GetPublisher(), "signature_status": pl.GetSignatureStatus(),
			"tool_name": pl.GetToolName(), "instance_key": pl.GetKey(), "skills": orEmpty(pl.GetSkills()),
		})
	}
	bindings := make([]map[string]any, 0, len(channels.GetChannels()))
	for _, ch := range channels.GetChannels() {
		bindings = append(bindings, map[string]any{
			"alias": ch.GetAlias(), "plugin": ch.GetPlugin(), "listen": ch.GetListen(), "agent": ch.GetAgent(),
			"instance_key": ch.GetInstanceKey(), "state": ch.GetState(), "reason": ch.GetReason(),
		})
	}
	return map[string]any{
		"enabled": list.GetEnabled(), "plugins_dir": list.GetPluginsDir(), "signature_mode": list.GetSignatureMode(),
		"plugins": plugins, "channels": bindings,
	}, nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
