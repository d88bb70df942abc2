package e2e_test

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// keepDeadOwner writes, under the spool of data directory dataDir, the
// folder a replica that died leaves: sub (the alias's folder, then the
// plugin's in the current layout) holding owner folder "r-dead", its
// lock and one kept message per body, named as the release that wrote
// it named them.
func keepDeadOwner(t *testing.T, dataDir string, sub []string, names, bodies []string) string {
	t.Helper()
	owner := filepath.Join(append(append([]string{dataDir, "channel-spool"}, sub...), "r-dead")...)
	if err := os.MkdirAll(owner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(owner, "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, body := range bodies {
		if err := os.WriteFile(filepath.Join(owner, names[i]), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return owner
}

// installWebhookAs installs the webhook example plugin a second time,
// named name: a second channel plugin of the same shape.
func installWebhookAs(t *testing.T, dataDir, name string) {
	t.Helper()
	installPlugin(t, dataDir, "webhook")
	from, to := filepath.Join(dataDir, "plugins", "webhook"), filepath.Join(dataDir, "plugins", name)
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"plugin.wasm", "manifest.toml"} {
		raw, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "manifest.toml" {
			raw = []byte(strings.Replace(string(raw), `name = "webhook"`, `name = "`+name+`"`, 1))
		}
		if err := os.WriteFile(filepath.Join(to, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// What replicas that died left in the spool of channel "web" is
// delivered by the bindings that follow, each message by its own plugin:
// the webhook plugin's by the alias bound to webhook, the second
// plugin's (webhook2) only once the alias is bound to it, and the
// messages of the release before the plugin-keyed layout (which name no
// plugin) by the first binding. Those were only logged, and stayed on
// disk undelivered for good though their senders had been answered 202.
// A kept "message" that is a symlink is never followed.
func TestPluginChannelSpoolsKeptApartAndTheOldLayoutDelivered(t *testing.T) {
	t.Parallel()
	dataDir := e2e.TempDataDir(t)
	installWebhookAs(t, dataDir, "webhook2")
	alias := hex.EncodeToString([]byte("web"))
	plugin := func(name string) string { return "p-" + hex.EncodeToString([]byte(name)) }
	msg := func(id, text string) string {
		return fmt.Sprintf(`{"id":%q,"from":"ann","text":%q,"thread":%q}`, id, text, id)
	}
	keepDeadOwner(t, dataDir, []string{alias, plugin("webhook")},
		[]string{"00000000000000000001-hostmsg_0123456789abcdef01234567.msg"}, []string{msg("w1", "/say kept for webhook")})
	keepDeadOwner(t, dataDir, []string{alias, plugin("webhook2")},
		[]string{"00000000000000000001-hostmsg_0123456789abcdef01234568.msg"}, []string{msg("w2", "/say kept for webhook2")})
	old := keepDeadOwner(t, dataDir, []string{alias},
		[]string{"00000000000000000001.msg"}, []string{msg("o1", "/say kept by the old release")})
	secret := filepath.Join(filepath.Dir(dataDir), "outside.json")
	if err := os.WriteFile(secret, []byte(msg("s1", "/say read through a symlink")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(old, "00000000000000000002.msg")); err != nil {
		t.Fatal(err)
	}

	s := e2e.Start(t, e2e.Options{DataDir: dataDir, Args: []string{"--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8"}})
	v := newConv(t, s, nil)
	hookURL, replies := replyHook(t)
	v.call("config/set", map[string]any{"prop": "plugins.entries." + abi.InstanceKey("webhook2", abi.WorldChannel, "web") + ".config",
		"value": map[string]any{"webhook_url": hookURL, "token": "tok-e2e"}})
	bindWebChannel(t, v, hookURL)
	webChannelListen(t, v, "")
	waitFor(t, "the webhook binding's kept messages", 90*time.Second, func() bool { return len(replies()) >= 2 })
	// The binding looked at the other plugin's folder and left it.
	log := replicaLogs(s, 1)[0]
	waitFor(t, "the other plugin's message counted", 30*time.Second, func() bool {
		return strings.Contains(readFile(log), "messages accepted for another plugin of this alias")
	})
	// Counted by status too, not only in the sandbox's log: the alias,
	// the plugin it waits for, how many and how old.
	out, err := clawmesh(t, s, "status")
	if err != nil || !regexp.MustCompile(`"web" → webhook2 +1 kept, oldest \S+ old`).MatchString(out) {
		t.Fatalf("status does not count webhook2's kept message (%v):\n%s", err, out)
	}
	// Two conversations: answered in either order.
	got := replies()
	if first := slices.Sorted(slices.Values(got)); !slices.Equal(first, []string{"kept by the old release", "kept for webhook"}) {
		t.Fatalf("replies %q of the binding to webhook, want the old release's message and webhook's", got)
	}

	v.call("config/set", map[string]any{"prop": "channels.plugin.web.plugin", "value": "webhook2"})
	waitFor(t, "the webhook2 binding's kept message", 90*time.Second, func() bool { return len(replies()) >= 3 })
	got = replies()
	if len(got) != 3 || got[2] != "kept for webhook2" {
		t.Fatalf("replies %q, want webhook2's message answered once it was bound", got)
	}
	if raw, err := os.ReadFile(secret); err != nil || !strings.Contains(string(raw), "s1") {
		t.Fatalf("the symlink's target: %q, %v", raw, err)
	}
	for _, r := range got {
		if strings.Contains(r, "symlink") {
			t.Fatalf("a symlink in the spool was read: replies %q", got)
		}
	}
}

// Messages kept for a plugin nobody binds again stayed on disk for good:
// status counted them and named no way out but removing folders by hand
// with the stack stopped. Past a day status (and health --config-dir)
// now say they wait, with their bytes, and spool drop removes them: not
// while a running replica holds the alias's spool for that plugin (the
// alias bound to it), and never for a name that is not an alias.
func TestSpoolDropOfAPluginNeverBoundAgain(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)
	hookURL, _ := replyHook(t)
	bindWebChannel(t, v, hookURL)
	webChannelListen(t, v, "")
	body := `{"id":"g1","from":"ann","text":"/say for a plugin removed","thread":"g1"}`
	owner := keepDeadOwner(t, s.DataDir, []string{hex.EncodeToString([]byte("web")), "p-" + hex.EncodeToString([]byte("gone"))},
		[]string{"00000000000000000001-hostmsg_0123456789abcdef01234569.msg"}, []string{body})
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(owner, "00000000000000000001-hostmsg_0123456789abcdef01234569.msg"), old, old); err != nil {
		t.Fatal(err)
	}

	out, err := clawmesh(t, s, "status")
	want := regexp.MustCompile(`"web" → gone +1 kept, oldest 4[78]h\S* old, ` + fmt.Sprint(len(body)) + ` B +WAITING past 24h0m0s or 64.0 MiB: .*clawmesh spool drop web --plugin gone`)
	if err != nil || !want.MatchString(out) {
		t.Fatalf("status does not warn of the message waiting for plugin gone (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "health", "--config-dir", s.DataDir, "plugin-sandbox"); err != nil ||
		!strings.Contains(out, "channel spool: 1 messages kept, not delivered yet ("+fmt.Sprint(len(body))+" B)") || !strings.Contains(out, "WAITING") {
		t.Fatalf("health --config-dir does not count the spool (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "spool", "list"); err != nil || !want.MatchString(out) {
		t.Fatalf("spool list (%v):\n%s", err, out)
	}
	// The alias is bound to webhook: its spool is the running replica's.
	if out, err := clawmesh(t, s, "spool", "drop", "web"); err == nil || !strings.Contains(out, "held by a running sandbox replica") || !strings.Contains(out, "webhook") {
		t.Fatalf("spool drop of the bound alias (%v):\n%s", err, out)
	}
	if _, err := os.Stat(owner); err != nil {
		t.Fatalf("a refused drop removed the kept message: %v", err)
	}
	if out, err := clawmesh(t, s, "spool", "drop", "../web"); err == nil || !strings.Contains(out, "not a channel alias") {
		t.Fatalf("spool drop of a path (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "spool", "drop", "web", "--plugin", "gone"); err != nil || !strings.Contains(out, "dropped 1 kept channel messages") {
		t.Fatalf("spool drop --plugin gone (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "spool", "list"); err != nil || !strings.Contains(out, "no channel messages kept") {
		t.Fatalf("spool list after the drop (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "status"); err != nil || strings.Contains(out, "gone") {
		t.Fatalf("status after the drop (%v):\n%s", err, out)
	}
}
