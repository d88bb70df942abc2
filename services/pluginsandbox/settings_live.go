package pluginsandbox

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/manifest"
)

// Live are the plugin settings a replica follows while it runs: a change
// is applied at the next scan, without a restart.
type Live struct {
	// Enabled is plugins.enabled: false unloads everything.
	Enabled bool
	// Policy is plugins.security.
	Policy manifest.Policy
	// Channels are the channels.plugin.<alias> bindings, by alias.
	Channels map[string]ChannelBinding
}

// ChannelBinding is one channels.plugin.<alias> entry: which channel
// plugin serves the alias, where its host listener binds, and which agent
// the messages it receives are prompted to.
type ChannelBinding struct {
	Alias string
	// Plugin is the channel plugin's name.
	Plugin string
	// Listen is host:port with an explicit host; default 127.0.0.1:0.
	Listen string
	// Agent is the agent alias sessions are created for; default
	// "default".
	Agent string
}

// DefaultChannelListen is where a channel's host listener binds unless
// configured: loopback, any free port.
const DefaultChannelListen = "127.0.0.1:0"

// DefaultLive are the settings with nothing configured.
func DefaultLive() Live {
	return Live{Enabled: true, Policy: manifest.DefaultPolicy()}
}

// liveFrom reads the live plugin settings from a config document (the
// typed document of the config service, secrets masked).
func liveFrom(doc map[string]any) (Live, error) {
	l := DefaultLive()
	plugins, _ := doc["plugins"].(map[string]any)
	if v, ok := plugins["enabled"].(bool); ok {
		l.Enabled = v
	}
	security, _ := plugins["security"].(map[string]any)
	if mode, ok := security["signature_mode"].(string); ok {
		l.Policy.Mode = manifest.Mode(mode)
	}
	if keys, ok := security["trusted_publisher_keys"].([]any); ok {
		for _, k := range keys {
			if s, ok := k.(string); ok {
				l.Policy.Trusted = append(l.Policy.Trusted, s)
			}
		}
	}
	if err := l.Policy.Validate(); err != nil {
		return l, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	channels, _ := doc["channels"].(map[string]any)
	bindings, _ := channels["plugin"].(map[string]any)
	for alias, raw := range bindings {
		fields, _ := raw.(map[string]any)
		b := ChannelBinding{Alias: alias, Listen: DefaultChannelListen, Agent: "default"}
		if v, ok := fields["plugin"].(string); ok {
			b.Plugin = v
		}
		if v, ok := fields["listen"].(string); ok && v != "" {
			b.Listen = v
		}
		if v, ok := fields["agent"].(string); ok && v != "" {
			b.Agent = v
		}
		if l.Channels == nil {
			l.Channels = map[string]ChannelBinding{}
		}
		l.Channels[alias] = b
	}
	return l, nil
}

// validate checks one binding before anything binds.
func (b ChannelBinding) validate() error {
	if !manifest.NamePattern.MatchString(b.Plugin) {
		return fmt.Errorf("channels.plugin.%s.plugin must name a channel plugin", b.Alias)
	}
	host, port, err := net.SplitHostPort(b.Listen)
	if err != nil {
		return fmt.Errorf("channels.plugin.%s.listen %q: %w", b.Alias, b.Listen, err)
	}
	if host == "" {
		// ":8080" would listen on every interface: say so explicitly.
		return fmt.Errorf("channels.plugin.%s.listen %q: name the host (127.0.0.1 for loopback, 0.0.0.0 for every interface)", b.Alias, b.Listen)
	}
	if host != "localhost" && net.ParseIP(host) == nil {
		return fmt.Errorf("channels.plugin.%s.listen %q: the host must be an IP address or localhost", b.Alias, b.Listen)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("channels.plugin.%s.listen %q: bad port", b.Alias, b.Listen)
	}
	return nil
}

// equalPolicy compares two policies, key order aside.
func equalPolicy(a, b manifest.Policy) bool {
	if a.Mode != b.Mode || len(a.Trusted) != len(b.Trusted) {
		return false
	}
	x, y := slices.Clone(a.Trusted), slices.Clone(b.Trusted)
	sort.Strings(x)
	sort.Strings(y)
	return slices.Equal(x, y)
}
