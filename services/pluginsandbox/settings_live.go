package pluginsandbox

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
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
	// Listen is host:port with an explicit host (schema default: loopback,
	// any free port).
	Listen string
	// Agent is the agent alias sessions are created for.
	Agent string
	// MaxSessions is channels.plugin.<alias>.max_sessions: the
	// conversations kept open in the session service, which holds it
	// (DefaultMaxSessions); 0 is DefaultMaxSessions.
	MaxSessions int
	// SpoolMaxMB is channels.plugin.<alias>.spool_max_mb: the MiB of
	// accepted, undelivered messages the alias's spool for its plugin
	// keeps on disk before it refuses new ones (channel_spool.go); 0 is
	// DefaultSpoolMaxMB.
	SpoolMaxMB int64
	// MaxContentKB is channels.plugin.<alias>.max_content_kb: the KiB a
	// message the plugin polls may carry as its content (1 to
	// wasmhost.MaxPolledContentBytes in KiB); past it the message is
	// refused and its sender told (pollRefused). 0 is
	// DefaultMaxContentKB.
	MaxContentKB int
	// RefusedAnswers is channels.plugin.<alias>.refused_answers: how
	// many more times the plugin may answer a polled message the host
	// refused for its size, without reading the inbound queue, before
	// the host rebuilds its instance, and, rebuilt, before the binding
	// fails (answeredAgain). 0 is DefaultRefusedAnswers.
	RefusedAnswers int
}

// DefaultRefusedAnswers is channels.plugin.<alias>.refused_answers's
// default (internal/configschema). More than one, so that a plugin
// taking the word a poll late is not rebuilt; each such answer waits for
// the poll interval or a queued message, so the channel is stalled about
// three seconds before the rebuild, and as long again before it fails.
const DefaultRefusedAnswers = 3

// maxRefusedAnswers bounds refused_answers: each answer is a poll
// interval (1 s) of a stalled channel, so a minute before the rebuild
// and one more before the failure at most. Past it an operator would
// leave the channel taking messages (202) no poll reaches for longer
// than the failure's Retry-After.
const maxRefusedAnswers = 60

// refusedAnswers is b's refused_answers.
func (b ChannelBinding) refusedAnswers() int {
	if b.RefusedAnswers <= 0 {
		return DefaultRefusedAnswers
	}
	return b.RefusedAnswers
}

// DefaultMaxContentKB is channels.plugin.<alias>.max_content_kb's default
// (internal/configschema): the 1 MiB one message posted to the listener
// may carry (maxInboundBody). A plugin that fetches its messages itself
// (over HTTP) may bring larger ones; the alias then sets more.
const DefaultMaxContentKB = wasmhost.DefaultPolledContentBytes >> 10

// maxContentBytes is b's bound of a polled message's content in bytes.
func (b ChannelBinding) maxContentBytes() int {
	n := b.MaxContentKB
	if n <= 0 {
		n = DefaultMaxContentKB
	}
	return n << 10
}

// DefaultSpoolMaxMB is channels.plugin.<alias>.spool_max_mb's default
// (internal/configschema). One live replica holds at most 32 MiB of an
// alias's messages (16 MiB queued, as much again polled), so 64 MiB is
// two replicas' worth, or one replica and what a dead one left; it is
// also the size past which status has marked a spool WAITING since the
// fifty-eighth round.
const DefaultSpoolMaxMB = 64

// spoolMaxBytes is b's spool bound in bytes.
func (b ChannelBinding) spoolMaxBytes() int64 {
	n := b.SpoolMaxMB
	if n <= 0 {
		n = DefaultSpoolMaxMB
	}
	return n << 20
}

// maxSessions is b's bound of open conversations, at least
// maxConversations (the deliveries that hold one at once).
func (b ChannelBinding) maxSessions() int {
	n := b.MaxSessions
	if n <= 0 {
		n = DefaultMaxSessions
	}
	return max(n, maxConversations)
}

// DefaultLive are the settings of a config document that sets nothing:
// the schema's defaults (internal/configschema).
func DefaultLive() Live {
	l, _ := LiveFrom(configclient.Snapshot{})
	return l
}

// LiveFrom reads the live plugin settings from a config revision; absent
// properties take the schema's defaults.
func LiveFrom(snap configclient.Snapshot) (Live, error) {
	p := snap.PluginSettings()
	l := Live{
		Enabled: snap.Bool("plugins.enabled"),
		Policy:  manifest.Policy{Mode: manifest.Mode(p.SignatureMode), Trusted: p.TrustedPublisherKeys},
	}
	if err := l.Policy.Validate(); err != nil {
		return l, fmt.Errorf("%w: %w", ErrSettings, err)
	}
	raw, _ := snap.Value("channels.plugin")
	bindings, _ := raw.(map[string]any)
	for alias := range bindings {
		at := "channels.plugin." + alias + "."
		if l.Channels == nil {
			l.Channels = map[string]ChannelBinding{}
		}
		l.Channels[alias] = ChannelBinding{Alias: alias, Plugin: snap.String(at + "plugin"),
			Listen: snap.String(at + "listen"), Agent: snap.String(at + "agent"), MaxSessions: int(snap.Int(at + "max_sessions")),
			SpoolMaxMB: snap.Int(at + "spool_max_mb"), MaxContentKB: int(snap.Int(at + "max_content_kb")),
			RefusedAnswers: int(snap.Int(at + "refused_answers"))}
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
	if most := wasmhost.MaxPolledContentBytes >> 10; b.MaxContentKB < 0 || b.MaxContentKB > most {
		return fmt.Errorf("channels.plugin.%s.max_content_kb %d: a message's content is 1 to %d KiB", b.Alias, b.MaxContentKB, most)
	}
	if b.RefusedAnswers < 0 || b.RefusedAnswers > maxRefusedAnswers {
		return fmt.Errorf("channels.plugin.%s.refused_answers %d: 1 to %d answers", b.Alias, b.RefusedAnswers, maxRefusedAnswers)
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
